//! ## What it checks
//! `actor_rollout_ref.hybrid_engine: false`.
//!
//! ## Why
//! verl's PPO trainer only implements the hybrid engine (actor, rollout and reference policy
//! colocated on the same GPUs) and asserts "Currently, only support hybrid engine" when it is
//! created.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   hybrid_engine: false
//! ```
//!
//! ## Fix
//! Remove the key (the default is `true`).

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V034");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    if ctx.config.actor_rollout_ref.hybrid_engine {
        return;
    }
    let key = "actor_rollout_ref.hybrid_engine";
    out.push(
        Diagnostic::error(CODE, "verl's PPO trainer supports only the hybrid engine")
            .with_key(key)
            .with_primary(ctx.origin(key), "turned off here")
            .with_help(format!("set `{key}=true` (or remove it)")),
    );
}
