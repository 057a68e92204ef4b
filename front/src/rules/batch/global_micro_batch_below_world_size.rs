//! ## What it checks
//! When the deprecated global micro-batch size `ppo_micro_batch_size` is set (actor, or FSDP
//! critic when it runs) and dynamic batching is off, `ppo_micro_batch_size ×
//! ulysses_sequence_parallel_size` must be at least the GPU count.
//!
//! ## Why
//! The global size is divided by the data-parallel size to get each rank's micro-batch; below
//! the GPU count that gives zero. verl rejects it in `ActorConfig.validate` /
//! `FSDPCriticConfig.validate` ("ppo_micro_batch_size (…) * ulysses_sequence_parallel_size (…)
//! must be >= n_gpus (…)").
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     ppo_micro_batch_size: 4    # 4 responses over 8 GPUs
//! trainer:
//!   n_gpus_per_node: 8
//! ```
//!
//! ## Fix
//! Use `ppo_micro_batch_size_per_gpu` instead (responses per GPU), or raise the global size
//! to at least the GPU count.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{critic_runs, is_fsdp, n_gpus};

const CODE: Code = Code("V004");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let gpus = n_gpus(c);
    let a = &c.actor_rollout_ref.actor;
    if !a.use_dynamic_bsz
        && let Some(micro) = a.ppo_micro_batch_size
    {
        // verl reads the role-level Ulysses key here (FSDP only; Megatron has none).
        let sp = if is_fsdp(a.strategy) {
            a.ulysses_sequence_parallel_size.unwrap_or(1)
        } else {
            1
        };
        push(ctx, out, "actor_rollout_ref.actor", micro, sp, gpus);
    }
    let cr = &c.critic;
    if critic_runs(c)
        && is_fsdp(cr.strategy)
        && !cr.use_dynamic_bsz
        && let Some(micro) = cr.ppo_micro_batch_size
    {
        push(
            ctx,
            out,
            "critic",
            micro,
            cr.ulysses_sequence_parallel_size.unwrap_or(1),
            gpus,
        );
    }
}

fn push(ctx: &RuleContext, out: &mut Vec<Diagnostic>, role: &str, micro: i64, sp: i64, gpus: i64) {
    if micro.saturating_mul(sp) >= gpus {
        return;
    }
    let key = format!("{role}.ppo_micro_batch_size");
    let sp_text = if sp > 1 {
        format!(" × sequence parallel {sp}")
    } else {
        String::new()
    };
    let minimum = gpus.saturating_add(sp.max(1) - 1) / sp.max(1);
    let mut d = Diagnostic::error(
        CODE,
        format!("global micro-batch {micro}{sp_text} of `{role}` is smaller than the {gpus} GPUs, so some ranks get no sample"),
    )
    .with_key(key.clone())
    .with_primary(ctx.origin(&key), format!("{micro} responses over all ranks"))
    .with_secondary(ctx.origin("trainer.n_gpus_per_node"), "GPUs per node set here");
    if sp > 1 {
        d = d.with_secondary(
            ctx.origin(&format!("{role}.ulysses_sequence_parallel_size")),
            "sequence parallel size set here",
        );
    }
    out.push(d.with_help(format!(
        "replace it by `{key}_per_gpu` (responses per GPU), or raise it to at least {minimum}"
    )));
}
