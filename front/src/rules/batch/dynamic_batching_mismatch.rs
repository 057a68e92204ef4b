//! ## What it checks
//! With verl's engine workers (`trainer.use_legacy_worker_impl: disable`),
//! `actor_rollout_ref.rollout.log_prob_use_dynamic_bsz` must equal
//! `actor_rollout_ref.actor.use_dynamic_bsz`. The rollout key copies the actor's by default.
//!
//! ## Why
//! The engine worker drives the actor's training and its old-log-prob pass with one engine and
//! asserts that both use the same batching mode when it builds the actor
//! (`ActorRolloutRefWorker.init_model`), after the cluster has started.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     use_dynamic_bsz: true
//!   rollout:
//!     log_prob_use_dynamic_bsz: false
//! trainer:
//!   use_legacy_worker_impl: disable
//! ```
//!
//! ## Fix
//! Remove the rollout override so it follows the actor, or set both to the same value.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::new_engine;

const CODE: Code = Code("V010");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    if !new_engine(c) {
        return;
    }
    let actor = c.actor_rollout_ref.actor.use_dynamic_bsz;
    let rollout = c.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz;
    if actor == rollout {
        return;
    }
    let key = "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz";
    out.push(
        Diagnostic::error(
            CODE,
            format!("the old-log-prob pass uses log_prob_use_dynamic_bsz {rollout} but the actor uses use_dynamic_bsz {actor}; verl's engine workers need them equal"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), format!("{rollout} here"))
        .with_secondary(ctx.origin("actor_rollout_ref.actor.use_dynamic_bsz"), format!("actor uses {actor}"))
        .with_secondary(ctx.origin("trainer.use_legacy_worker_impl"), "engine workers chosen here")
        .with_help(format!("remove `{key}` so it follows the actor, or set it to {actor}")),
    );
}
