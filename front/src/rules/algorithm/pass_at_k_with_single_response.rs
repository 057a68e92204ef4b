//! ## What it checks
//! `algorithm.adv_estimator: grpo_passk` with `actor_rollout_ref.rollout.n` below 2.
//!
//! ## Why
//! The pass@k advantage compares each response with the others of its group; verl raises
//! "Pass@k requires at least 2 samples per group" at the first advantage computation, after a
//! full rollout.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   adv_estimator: grpo_passk
//! actor_rollout_ref:
//!   rollout:
//!     n: 1
//! ```
//!
//! ## Fix
//! Generate several responses per prompt (`rollout.n` of 2 or more; 4–16 is usual).

use crate::config::AdvEstimator;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V028");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let n = c.actor_rollout_ref.rollout.n;
    if c.algorithm.adv_estimator != AdvEstimator::GrpoPassk || n >= 2 {
        return;
    }
    let key = "actor_rollout_ref.rollout.n";
    out.push(
        Diagnostic::error(
            CODE,
            format!("grpo_passk needs at least 2 responses per prompt, but rollout.n is {n}"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), format!("{n} response per prompt"))
        .with_secondary(
            ctx.origin("algorithm.adv_estimator"),
            "grpo_passk chosen here",
        )
        .with_help(format!("set `{key}` to 2 or more (e.g. 8)")),
    );
}
