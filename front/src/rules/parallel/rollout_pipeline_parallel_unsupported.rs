//! ## What it checks
//! `actor_rollout_ref.rollout.pipeline_model_parallel_size` above 1 with the `vllm`, `sglang`
//! or `trtllm` engine.
//!
//! ## Why
//! verl has not implemented pipeline-parallel rollouts for these engines and raises
//! `NotImplementedError` ("Current rollout … not implemented pipeline_model_parallel_size > 1
//! yet") when it builds the rollout config.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   rollout:
//!     name: vllm
//!     pipeline_model_parallel_size: 2
//! ```
//!
//! ## Fix
//! Use tensor (or data) parallelism for the rollout and set the pipeline size to 1.

use crate::config::RolloutName;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V019");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let r = &ctx.config.actor_rollout_ref.rollout;
    let pp = r.pipeline_model_parallel_size;
    if pp <= 1
        || !matches!(
            r.name,
            RolloutName::Vllm | RolloutName::Sglang | RolloutName::Trtllm
        )
    {
        return;
    }
    let engine = crate::config::common::spelling(&r.name);
    let key = "actor_rollout_ref.rollout.pipeline_model_parallel_size";
    let tp = r.tensor_model_parallel_size.saturating_mul(pp);
    out.push(
        Diagnostic::error(CODE, format!("verl's {engine} rollout does not support pipeline parallelism (pipeline_model_parallel_size {pp})"))
            .with_key(key)
            .with_primary(ctx.origin(key), format!("pipeline parallel {pp}"))
            .with_secondary(ctx.origin("actor_rollout_ref.rollout.name"), format!("{engine} chosen here"))
            .with_help(format!("set `{key}` to 1 and use tensor parallelism instead (e.g. tensor_model_parallel_size {tp})")),
    );
}
