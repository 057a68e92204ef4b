//! ## What it checks
//! A rollout replica (`tensor × data × pipeline` parallel ranks of `actor_rollout_ref.rollout`)
//! that is larger than a node must be a whole number of nodes
//! (`trainer.n_gpus_per_node`).
//!
//! ## Why
//! verl places each replica on `size ÷ min(GPUs per node, size)` nodes and asserts the division
//! when it creates the replicas ("world_size … must be divisible by gpus_per_node …").
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   rollout:
//!     tensor_model_parallel_size: 12   # 1.5 nodes of 8 GPUs
//! trainer:
//!   n_gpus_per_node: 8
//!   nnodes: 3
//! ```
//!
//! ## Fix
//! Keep a replica within one node, or make it a multiple of the GPUs per node.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V017");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let r = &c.actor_rollout_ref.rollout;
    let size = r
        .tensor_model_parallel_size
        .saturating_mul(r.data_parallel_size)
        .saturating_mul(r.pipeline_model_parallel_size);
    let per_node = c.trainer.n_gpus_per_node.min(size);
    if per_node <= 0 || size % per_node == 0 {
        return;
    }
    let gpn = c.trainer.n_gpus_per_node;
    let key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
    let down = (size / gpn).max(1) * gpn;
    out.push(
        Diagnostic::error(CODE, format!("a rollout replica of {size} GPUs spans {size} ÷ {gpn} nodes, not a whole number"))
            .with_key(key)
            .with_primary(ctx.origin(key), format!("rollout tensor parallel {}", r.tensor_model_parallel_size))
            .with_secondary(ctx.origin("trainer.n_gpus_per_node"), format!("{gpn} GPUs per node"))
            .with_help(format!("make the replica (tensor × data × pipeline) at most {gpn} or a multiple of it, e.g. {down}")),
    );
}
