//! ## What it checks
//! For a Megatron actor (and a Megatron critic when it runs), the GPU count must be a multiple
//! of `tensor_model_parallel_size × pipeline_model_parallel_size × context_parallel_size`.
//!
//! ## Why
//! The remaining factor is the data-parallel size, which must be whole. verl asserts it in
//! `validate_config` ("n_gpus (…) must be divisible by model_parallel_size (…) times
//! context_parallel_size (…)", when dynamic batching is off), and Megatron's
//! `initialize_model_parallel` refuses such a layout in any case.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     strategy: megatron
//!     megatron:
//!       tensor_model_parallel_size: 4
//!       pipeline_model_parallel_size: 3   # 12 does not divide 8 GPUs
//! trainer:
//!   n_gpus_per_node: 8
//! ```
//!
//! ## Fix
//! Choose parallel sizes whose product divides the GPU count, or change the GPU count.

use crate::config::{MegatronEngineConfig, Strategy};
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{critic_runs, megatron_model_parallel, n_gpus, nearest_divisor};

const CODE: Code = Code("V014");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let a = &c.actor_rollout_ref.actor;
    if a.strategy == Strategy::Megatron
        && let Some(m) = &a.megatron
    {
        push(ctx, out, "actor_rollout_ref.actor.megatron", m);
    }
    if critic_runs(c)
        && c.critic.strategy == Strategy::Megatron
        && let Some(m) = &c.critic.megatron
    {
        push(ctx, out, "critic.megatron", m);
    }
}

fn push(ctx: &RuleContext, out: &mut Vec<Diagnostic>, prefix: &str, m: &MegatronEngineConfig) {
    let gpus = n_gpus(ctx.config);
    let mp = megatron_model_parallel(m);
    if mp <= 0 || gpus % mp == 0 {
        return;
    }
    let (tp, pp, cp) = (
        m.tensor_model_parallel_size,
        m.pipeline_model_parallel_size,
        m.context_parallel_size,
    );
    let sizes = [
        ("tensor_model_parallel_size", "tensor", tp),
        ("pipeline_model_parallel_size", "pipeline", pp),
        ("context_parallel_size", "context", cp),
    ];
    // Blame the size whose change fixes the layout with the others kept: pipeline, then
    // tensor, then context parallel.
    let fix = [1usize, 0, 2].into_iter().find_map(|i| {
        let rest: i64 = sizes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, s)| s.2)
            .fold(1i64, |acc, s| acc.saturating_mul(s));
        if sizes[i].2 <= 1 && i != 0 || rest <= 0 || gpus % rest != 0 {
            return None;
        }
        nearest_divisor(gpus / rest, sizes[i].2).map(|v| (i, v))
    });
    let blamed = fix.map_or(0, |(i, _)| i);
    let key = format!("{prefix}.{}", sizes[blamed].0);
    let mut d = Diagnostic::error(
        CODE,
        format!("{gpus} GPUs are not a multiple of the model-parallel size {mp} (tensor {tp} × pipeline {pp} × context {cp})"),
    )
    .with_key(key.clone())
    .with_primary(ctx.origin(&key), format!("{} parallel {}", sizes[blamed].1, sizes[blamed].2));
    for (i, (name, what, size)) in sizes.iter().enumerate() {
        if i != blamed && *size > 1 {
            d = d.with_secondary(
                ctx.origin(&format!("{prefix}.{name}")),
                format!("{what} parallel {size}"),
            );
        }
    }
    d = d.with_secondary(
        ctx.origin("trainer.n_gpus_per_node"),
        "GPUs per node set here",
    );
    let help = match fix {
        Some((_, v)) => format!("set `{key}` to {v} so tensor × pipeline × context divides {gpus}"),
        None => format!(
            "choose tensor × pipeline × context parallel sizes whose product divides {gpus}"
        ),
    };
    out.push(d.with_help(help));
}
