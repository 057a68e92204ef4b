//! ## What it checks
//! `trainer.v1.trainer_mode: separate_async` (verl 0.9) against what that trainer asserts when
//! it is created:
//! - `data.train_batch_size` equals `trainer.v1.separate_async.parameter_sync_step` ×
//!   `actor_rollout_ref.actor.ppo_mini_batch_size` (each weight sync follows that many
//!   mini-batch updates, each on its own sample of the buffer);
//! - the separate rollout pool has nodes and GPUs: `actor_rollout_ref.rollout.nnodes` (0 by
//!   default) and `actor_rollout_ref.rollout.n_gpus_per_node` above 0;
//! - `actor_rollout_ref.rollout.checkpoint_engine.backend` is not `naive` (the default: it
//!   only syncs weights within colocated processes);
//! - with a reward model, `reward.reward_model.enable_resource_pool: true` (the separate
//!   rollout never pauses to free GPU memory for a colocated one).
//!
//! ## Why
//! Each is an `assert` in verl's `PPOTrainerSeparateAsync.__init__`: the run stops before its
//! first step, after the cluster was allocated.
//!
//! ## Example
//! ```yaml
//! trainer:
//!   v1:
//!     trainer_mode: separate_async
//! ```
//!
//! ## Fix
//! Give the rollout pool its GPUs (`rollout.nnodes`, `rollout.n_gpus_per_node`), a weight-sync
//! backend (`nccl`, `nixl`, `mooncake`, ...) and batch sizes that agree.

use crate::config::TrainerMode;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V065");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    if ctx.v1_trainer_mode() != Some(TrainerMode::SeparateAsync) {
        return;
    }
    let v1 = ctx.config.trainer.v1.as_ref();
    let mut report = |key: &str, message: String, help: &str| {
        out.push(
            Diagnostic::error(CODE, message)
                .with_key(key)
                .with_primary(ctx.origin(key), "set here")
                .with_help(help.to_owned()),
        );
    };

    let batch = ctx.config.data.train_batch_size;
    let mini = ctx.config.actor_rollout_ref.actor.ppo_mini_batch_size;
    if let Some(sync) = v1
        .and_then(|v| v.separate_async.as_ref())
        .map(|s| s.parameter_sync_step)
        && batch != sync.saturating_mul(mini)
    {
        report(
            "data.train_batch_size",
            format!(
                "separate_async needs data.train_batch_size = parameter_sync_step × ppo_mini_batch_size, got {batch} ≠ {sync} × {mini}"
            ),
            "set trainer.v1.separate_async.parameter_sync_step to train_batch_size / ppo_mini_batch_size",
        );
    }
    let rollout = &ctx.config.actor_rollout_ref.rollout;
    for (key, value) in [
        ("actor_rollout_ref.rollout.nnodes", rollout.nnodes),
        (
            "actor_rollout_ref.rollout.n_gpus_per_node",
            rollout.n_gpus_per_node,
        ),
    ] {
        if let Some(n) = value.filter(|&n| n <= 0) {
            report(
                key,
                format!(
                    "separate_async runs its rollout on a pool of its own: `{key}` must be above 0, got {n}"
                ),
                "give the rollout pool its nodes and GPUs per node",
            );
        }
    }
    let backend = "actor_rollout_ref.rollout.checkpoint_engine.backend";
    if ctx.node(backend).and_then(|n| n.as_str()) == Some("naive") {
        report(
            backend,
            "separate_async syncs weights to a rollout pool on other GPUs: the `naive` checkpoint engine (colocated processes only) cannot".into(),
            "use nccl, nixl, mooncake or another backend that reaches the rollout pool",
        );
    }
    let rm = "reward.reward_model";
    let enabled = ctx.node(&format!("{rm}.enable")).and_then(|n| n.as_bool()) == Some(true);
    let pool = format!("{rm}.enable_resource_pool");
    if enabled && ctx.node(&pool).and_then(|n| n.as_bool()) != Some(true) {
        report(
            &pool,
            "separate_async needs the reward model on a resource pool of its own: the separate rollout never pauses to free GPU memory for a colocated one".into(),
            "set reward.reward_model.enable_resource_pool=true",
        );
    }
}
