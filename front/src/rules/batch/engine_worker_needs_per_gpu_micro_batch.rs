//! ## What it checks
//! With verl's engine workers (`trainer.use_legacy_worker_impl: disable`) and dynamic
//! batching off, `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` and
//! `actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu` must be set. The deprecated
//! global sizes (`ppo_micro_batch_size`, `log_prob_micro_batch_size`) pass verl's early
//! validation but the engine workers never read them.
//!
//! ## Why
//! The engine worker asserts both per-GPU sizes when it builds the actor
//! (`ActorRolloutRefWorker.init_model`), after the cluster has started.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     ppo_micro_batch_size: 64       # deprecated, ignored by the engine workers
//! trainer:
//!   use_legacy_worker_impl: disable
//! ```
//!
//! ## Fix
//! Replace the global size by the `_per_gpu` key (global size ÷ data-parallel size).

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::new_engine;

const CODE: Code = Code("V011");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let a = &c.actor_rollout_ref.actor;
    let r = &c.actor_rollout_ref.rollout;
    if !new_engine(c) || a.use_dynamic_bsz {
        return;
    }
    let pairs = [
        (
            "actor_rollout_ref.actor.ppo_micro_batch_size",
            a.ppo_micro_batch_size,
            a.ppo_micro_batch_size_per_gpu,
        ),
        (
            "actor_rollout_ref.rollout.log_prob_micro_batch_size",
            r.log_prob_micro_batch_size,
            r.log_prob_micro_batch_size_per_gpu,
        ),
    ];
    for (global_key, global, per_gpu) in pairs {
        // Neither set is V009's finding.
        let (Some(global), None) = (global, per_gpu) else {
            continue;
        };
        let per_gpu_key = format!("{global_key}_per_gpu");
        out.push(
            Diagnostic::error(
                CODE,
                format!("verl's engine workers ignore the deprecated `{global_key}` ({global}) and need `{per_gpu_key}`"),
            )
            .with_key(per_gpu_key.clone())
            .with_primary(ctx.origin(&per_gpu_key), "left null here")
            .with_secondary(ctx.origin(global_key), "deprecated global size set here")
            .with_secondary(ctx.origin("trainer.use_legacy_worker_impl"), "engine workers chosen here")
            .with_help(format!("replace `{global_key}` by `{per_gpu_key}` (the global size divided by the data-parallel size)")),
        );
    }
}
