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
use crate::reward::{Model, Rewards};
use crate::rules::RuleContext;

const CODE: Code = Code("V033");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let rewards = Rewards::of(ctx.config, ctx.root);
    let (on, pool_key) = rewards.model.resource_pool();
    if !on {
        return;
    }
    let ((gpus, gpus_key), (nodes, nodes_key)) = match rewards.model {
        Model::Legacy(rm) => (
            (rm.n_gpus_per_node, "reward_model.n_gpus_per_node"),
            (rm.nnodes, "reward_model.nnodes"),
        ),
        Model::Loop(m) => (m.n_gpus_per_node, m.nnodes),
    };
    for (key, value, what) in [
        (gpus_key, gpus, "GPUs per node"),
        (nodes_key, nodes, "nodes"),
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
            .with_secondary(ctx.origin(pool_key), "separate pool turned on here")
            .with_help(format!(
                "set `{key}` to a positive number, or `{pool_key}=false`"
            )),
        );
    }
}
