//! ## What it checks
//! A vLLM rollout with expert parallelism (`expert_parallel_size` above 1) whose tensor
//! parallel size does not divide the GPUs a replica uses on one node
//! (`min(trainer.n_gpus_per_node, tensor × data × pipeline)`).
//!
//! ## Why
//! verl's vLLM server asserts "gpus_per_node should be divisible by
//! tensor_model_parallel_size" when it launches an expert-parallel engine.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   rollout:
//!     tensor_model_parallel_size: 3
//!     data_parallel_size: 4
//!     expert_parallel_size: 12
//! trainer:
//!   n_gpus_per_node: 8
//! ```
//!
//! ## Fix
//! Use a tensor-parallel size that divides the GPUs per node.

use crate::config::RolloutName;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::nearest_divisor;

const CODE: Code = Code("V041");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let r = &c.actor_rollout_ref.rollout;
    if r.name != RolloutName::Vllm || r.expert_parallel_size <= 1 {
        return;
    }
    let tp = r.tensor_model_parallel_size;
    let replica = tp
        .saturating_mul(r.data_parallel_size)
        .saturating_mul(r.pipeline_model_parallel_size);
    let per_node = c.trainer.n_gpus_per_node.min(replica);
    if tp <= 0 || per_node % tp == 0 {
        return;
    }
    let key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
    let suggestion = nearest_divisor(per_node, tp).unwrap_or(1);
    out.push(
        Diagnostic::error(CODE, format!("an expert-parallel vLLM rollout needs its tensor parallel size {tp} to divide the {per_node} GPUs it uses per node"))
            .with_key(key)
            .with_primary(ctx.origin(key), format!("tensor parallel {tp}"))
            .with_secondary(ctx.origin("actor_rollout_ref.rollout.expert_parallel_size"), "expert parallelism turned on here")
            .with_secondary(ctx.origin("trainer.n_gpus_per_node"), "GPUs per node set here")
            .with_help(format!("set `{key}` to a divisor of {per_node}, e.g. {suggestion}")),
    );
}
