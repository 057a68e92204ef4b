//! ## What it checks
//! verl's legacy FSDP workers (the default, `trainer.use_legacy_worker_impl: auto`) turn the
//! global `ppo_mini_batch_size` (prompts) into a per-rank size: `ppo_mini_batch_size ×
//! rollout.n ÷ (GPUs ÷ ulysses_sequence_parallel_size)`, rounding down. This rule fires when
//! that is 0, for the actor and for the critic when it runs.
//!
//! ## Why
//! The worker asserts a positive result when it starts ("ppo_mini_batch_size … should be
//! larger than 0 after normalization"), after the cluster has been allocated and the model
//! loaded.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     ppo_mini_batch_size: 4     # 4 responses over 8 data-parallel ranks -> 0 per rank
//! trainer:
//!   n_gpus_per_node: 8
//! ```
//!
//! ## Fix
//! Raise `ppo_mini_batch_size` (or `rollout.n`) so every data-parallel rank gets at least one
//! response per mini-batch; a multiple of the data-parallel size splits evenly.

use crate::diag::{Code, Diagnostic};
use crate::role::Role;
use crate::rules::RuleContext;
use crate::rules::facts::{gcd, nearest_multiple, push_unique};

const CODE: Code = Code("V005");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    for (role, batch) in Role::trained(ctx.config) {
        if role.engine_worker || !role.is_fsdp() || role.sp <= 0 {
            continue;
        }
        let dp = role.world / role.sp;
        if dp <= 0 {
            continue;
        }
        let responses = batch.mini.saturating_mul(batch.n);
        if responses / dp > 0 {
            continue;
        }
        let key = format!("{}.ppo_mini_batch_size", role.prefix);
        let step = dp / gcd(dp, batch.n.max(1));
        let suggestion = nearest_multiple(batch.mini, step);
        let mut d = Diagnostic::error(
            CODE,
            format!(
                "a mini-batch of {responses} responses (ppo_mini_batch_size {} × n {}) over {dp} data-parallel ranks is 0 per rank",
                batch.mini, batch.n
            ),
        )
        .with_key(key.clone())
        .with_primary(ctx.origin(&key), format!("{} prompts per mini-batch", batch.mini))
        .with_secondary(ctx.origin("trainer.n_gpus_per_node"), "GPUs per node set here");
        if role.sp > 1 {
            d = d.with_secondary(ctx.origin(role.sp_key), "sequence parallel size set here");
        }
        push_unique(
            out,
            d.with_help(format!(
                "set `{key}` to a multiple of {step}, e.g. {suggestion}"
            )),
        );
    }
}
