//! ## What it checks
//! `actor_rollout_ref.rollout.prometheus.enable: true` while
//! `actor_rollout_ref.rollout.disable_log_stats` is `true` (its default).
//!
//! ## Why
//! The Prometheus export reads the engine's statistics; verl's agent-loop manager raises
//! "PROMETHEUS needs disable_log_stats==False, but it is currently True." after the rollout
//! servers have started.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   rollout:
//!     prometheus:
//!       enable: true
//! ```
//!
//! ## Fix
//! Also set `actor_rollout_ref.rollout.disable_log_stats: false`.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V042");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let r = &ctx.config.actor_rollout_ref.rollout;
    if !r.prometheus.enable || !r.disable_log_stats {
        return;
    }
    let key = "actor_rollout_ref.rollout.disable_log_stats";
    out.push(
        Diagnostic::error(
            CODE,
            "the Prometheus export needs the engine's statistics, but `disable_log_stats` is true",
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "statistics turned off here")
        .with_secondary(
            ctx.origin("actor_rollout_ref.rollout.prometheus.enable"),
            "Prometheus turned on here",
        )
        .with_help(format!("set `{key}=false`")),
    );
}
