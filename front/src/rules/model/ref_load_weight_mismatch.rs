//! ## What it checks
//! With the legacy Megatron workers and the reference policy running, a reference policy that
//! loads pretrained weights (`actor_rollout_ref.ref.load_weight: true`, the default) while the
//! actor does not (`actor_rollout_ref.actor.load_weight: false`).
//!
//! ## Why
//! The reference policy must start from the same weights as the actor; the Megatron worker
//! asserts `actor.load_weight == ref.load_weight` when it builds the reference model.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     strategy: megatron
//!     use_kl_loss: true
//!     load_weight: false
//! ```
//!
//! ## Fix
//! Set `actor_rollout_ref.ref.load_weight` to the actor's value.

use crate::config::Strategy;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{new_engine, reference_runs};

const CODE: Code = Code("V040");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let arr = &c.actor_rollout_ref;
    if arr.actor.strategy != Strategy::Megatron || new_engine(c) || !reference_runs(c) {
        return;
    }
    let actor = arr.actor.load_weight.unwrap_or(true);
    let reference = arr.reference.load_weight.unwrap_or(true);
    if !reference || actor {
        return;
    }
    let key = "actor_rollout_ref.actor.load_weight";
    out.push(
        Diagnostic::error(CODE, "the reference policy loads pretrained weights but the actor does not; verl requires both to match")
            .with_key(key)
            .with_primary(ctx.origin(key), "actor skips loading weights")
            .with_secondary(ctx.origin("actor_rollout_ref.ref.load_weight"), "reference policy loads them")
            .with_help("set `actor_rollout_ref.ref.load_weight=false` as well, or load the actor's weights"),
    );
}
