//! ## What it checks
//! With importance weights on (`algorithm.rollout_correction.rollout_is` set),
//! `rollout_is_threshold` must be a positive number, or (since verl 0.8.0) a string: a number,
//! or IcePop's `"lower_upper"` bounds, both positive, lower ≤ upper. A string on an older tree
//! (verlc's built-in one is verl 0.7.0's) is a warning: verlc runs it as verl 0.8 does.
//!
//! ## Why
//! verl parses the threshold when it first weights a batch, after a full rollout: 0.8+ raises
//! "Invalid rollout_is_threshold …", "rollout_is_threshold upper bound must be positive" or
//! "lower bound must be <= upper bound"; 0.7 compares the value with 0 and fails on a string.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   rollout_correction:
//!     rollout_is: token
//!     rollout_is_threshold: "4.0_0.5"   # lower first
//! ```
//!
//! ## Fix
//! Give the truncation bound (`2.0`), or IcePop's bounds lower first (`"0.5_4.0"`).

use crate::config::RatioThreshold;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V060");
const KEY: &str = "algorithm.rollout_correction.rollout_is_threshold";

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let rc = &ctx.config.algorithm.rollout_correction;
    if rc.rollout_is.is_none() {
        return;
    }
    let threshold = &rc.rollout_is_threshold;
    let at = ctx.origin(KEY);
    match threshold.importance_bounds() {
        Err(why) => out.push(
            Diagnostic::error(CODE, format!("{why} (verl raises when it first weights a batch)"))
                .with_key(KEY)
                .with_primary(at, "threshold set here")
                .with_help("give the truncation bound (e.g. 2.0), or IcePop's bounds lower first (e.g. \"0.5_4.0\", verl 0.8+)"),
        ),
        Ok(_) if matches!(threshold, RatioThreshold::Text(_)) && !ctx.release_at_least((0, 8)) => {
            out.push(
                Diagnostic::warning(
                    CODE,
                    "a string rollout_is_threshold arrived in verl 0.8.0 (IcePop's \"lower_upper\" among them); this config tree is verl 0.7, which raises on it (verlc runs it as verl 0.8 does)",
                )
                .with_key(KEY)
                .with_primary(at, "string threshold set here")
                .with_help("keep it for verlc or verl 0.8+, or give a number"),
            )
        }
        Ok(_) => {}
    }
}
