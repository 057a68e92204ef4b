//! ## What it checks
//! The GPU count must be a multiple of one rollout replica's size,
//! `tensor_model_parallel_size × data_parallel_size × pipeline_model_parallel_size` of
//! `actor_rollout_ref.rollout`.
//!
//! ## Why
//! The rollout engines run on the trainer's GPUs (hybrid engine), one replica per group of
//! that many ranks. verl asserts it when it builds the rollout ("rollout world_size: … is not
//! divisible by infer_world_size: …"), after the models are loaded.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   rollout:
//!     tensor_model_parallel_size: 3   # 8 GPUs are not a multiple of 3
//! ```
//!
//! ## Fix
//! Choose rollout parallel sizes whose product divides the GPU count.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{n_gpus, nearest_divisor};

const CODE: Code = Code("V016");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let gpus = n_gpus(ctx.config);
    let r = &ctx.config.actor_rollout_ref.rollout;
    let (tp, dp, pp) = (
        r.tensor_model_parallel_size,
        r.data_parallel_size,
        r.pipeline_model_parallel_size,
    );
    let size = tp.saturating_mul(dp).saturating_mul(pp);
    if size <= 0 || gpus % size == 0 {
        return;
    }
    let key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
    let mut d = Diagnostic::error(
        CODE,
        format!("{gpus} GPUs are not a multiple of the rollout replica size {size} (tensor {tp} × data {dp} × pipeline {pp})"),
    )
    .with_key(key)
    .with_primary(ctx.origin(key), format!("rollout tensor parallel {tp}"));
    if dp > 1 {
        d = d.with_secondary(
            ctx.origin("actor_rollout_ref.rollout.data_parallel_size"),
            format!("rollout data parallel {dp}"),
        );
    }
    if pp > 1 {
        d = d.with_secondary(
            ctx.origin("actor_rollout_ref.rollout.pipeline_model_parallel_size"),
            format!("rollout pipeline parallel {pp}"),
        );
    }
    d = d.with_secondary(
        ctx.origin("trainer.n_gpus_per_node"),
        "GPUs per node set here",
    );
    let rest = dp.saturating_mul(pp);
    let help = match (rest > 0 && gpus % rest == 0)
        .then(|| nearest_divisor(gpus / rest, tp))
        .flatten()
    {
        Some(t) => format!("set `{key}` to {t} so one replica divides {gpus} GPUs"),
        None => {
            format!("choose rollout tensor × data × pipeline sizes whose product divides {gpus}")
        }
    };
    out.push(d.with_help(help));
}
