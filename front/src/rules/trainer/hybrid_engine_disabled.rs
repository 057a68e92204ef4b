//! ## What it checks
//! `actor_rollout_ref.hybrid_engine: false` where the trainer that runs asserts on it.
//!
//! ## Why
//! verl's legacy PPO trainer (`RayPPOTrainer`: every release before 0.9, and 0.9's with
//! `trainer.use_v1: false`) only implements the hybrid engine (actor, rollout and reference
//! policy colocated on the same GPUs) and asserts "Currently, only support hybrid engine" when
//! it is created. verl 0.9's v1 trainer does not assert: verl 0.9.1's `separate_async` mode reads
//! the key (no rollout replicas on the training GPUs, only the separate rollout pool), the other
//! modes do not read it.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   hybrid_engine: false
//! ```
//!
//! ## Fix
//! Remove the key (the default is `true`), or, on verl 0.9.1, use it with
//! `trainer.v1.trainer_mode: separate_async`.

use crate::config::TrainerMode;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V034");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    if ctx.config.actor_rollout_ref.hybrid_engine {
        return;
    }
    let key = "actor_rollout_ref.hybrid_engine";
    let Some(mode) = ctx.v1_trainer_mode() else {
        out.push(
            Diagnostic::error(CODE, "verl's PPO trainer supports only the hybrid engine")
                .with_key(key)
                .with_primary(ctx.origin(key), "turned off here")
                .with_help(format!("set `{key}=true` (or remove it)")),
        );
        return;
    };
    let read = mode == TrainerMode::SeparateAsync && ctx.release_triple() >= (0, 9, 1);
    if !read {
        out.push(
            Diagnostic::warning(
                CODE,
                format!(
                    "verl {}'s v1 trainer does not read `{key}` in `trainer_mode: {}`: the rollout stays colocated with the trainer",
                    ctx.release_label(),
                    crate::config::common::spelling(&mode)
                ),
            )
            .with_key(key)
            .with_primary(ctx.origin(key), "has no effect")
            .with_help(
                "verl 0.9.1 honours it with `trainer.v1.trainer_mode: separate_async` only; otherwise remove it",
            ),
        );
    }
}
