//! ## What it checks
//! `actor_rollout_ref.rollout.mode: sync`.
//!
//! ## Why
//! verl removed synchronous rollouts; building the rollout config raises "Rollout mode 'sync'
//! has been removed. Please set `actor_rollout_ref.rollout.mode=async` or remove the mode
//! setting entirely."
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   rollout:
//!     mode: sync
//! ```
//!
//! ## Fix
//! Remove `mode` (the key is deprecated; `async` is the only mode).

use crate::config::RolloutMode;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V022");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    if ctx.config.actor_rollout_ref.rollout.mode != RolloutMode::Sync {
        return;
    }
    let key = "actor_rollout_ref.rollout.mode";
    out.push(
        Diagnostic::error(
            CODE,
            "rollout mode `sync` has been removed from verl; only `async` exists",
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "`sync` set here")
        .with_help("remove `actor_rollout_ref.rollout.mode` (or set it to `async`)"),
    );
}
