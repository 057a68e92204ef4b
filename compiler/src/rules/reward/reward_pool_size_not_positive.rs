//! ## What it checks
//! With `reward_model.enable_resource_pool: true`, `reward_model.n_gpus_per_node` and
//! `reward_model.nnodes` must both be positive.
//!
//! ## Why
//! verl builds a separate resource pool of that size for the reward model and raises
//! "config.reward_model.n_gpus_per_node must be greater than 0" (or `nnodes`) when it sets
//! up the pools. The defaults are 0 nodes.
//!
//! ## Example
//! ```yaml
//! reward_model:
//!   enable_resource_pool: true
//!   n_gpus_per_node: 8
//!   # nnodes stays 0
//! ```
//!
//! ## Fix
//! Give the pool's node and GPU counts, or turn the separate pool off.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V033");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let rm = &ctx.config.reward_model;
    if !rm.enable_resource_pool {
        return;
    }
    for (key, value, what) in [
        (
            "reward_model.n_gpus_per_node",
            rm.n_gpus_per_node,
            "GPUs per node",
        ),
        ("reward_model.nnodes", rm.nnodes, "nodes"),
    ] {
        if value > 0 {
            continue;
        }
        out.push(
            Diagnostic::error(
                CODE,
                format!("the separate reward-model pool has {value} {what}; it needs at least 1"),
            )
            .with_key(key)
            .with_primary(ctx.origin(key), format!("{value} {what}"))
            .with_secondary(
                ctx.origin("reward_model.enable_resource_pool"),
                "separate pool turned on here",
            )
            .with_help(format!(
                "set `{key}` to a positive number, or `reward_model.enable_resource_pool=false`"
            )),
        );
    }
}
