//! ## What it checks
//! `algorithm.rollout_correction.rollout_rs`, when set, must name a rejection-sampling mode
//! verl knows: one of `token`, `sequence`, `geometric` (verl 0.7.0), or a comma-separated list
//! of the divergence options of later verl releases (`token_k1`, `token_k2`, `token_k3`,
//! `seq_sum_k1`…`seq_sum_k3`, `seq_mean_k1`…`seq_mean_k3`, `seq_max_k2`, `seq_max_k3`).
//!
//! ## Why
//! The field is free text in verl's config; an unknown name raises ("Invalid rollout_rs: …" /
//! "Unsupported rollout_rs option: …") at the first training step, after a full rollout.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   rollout_correction:
//!     rollout_rs: seqence
//! ```
//!
//! ## Fix
//! Use one of the names above (or null to turn rejection sampling off).

use crate::diag::{Code, Diagnostic, did_you_mean};
use crate::rules::RuleContext;

const CODE: Code = Code("V029");

/// Single aggregation levels (verl 0.7.0).
pub(super) const LEVELS: &[&str] = &["token", "sequence", "geometric"];
/// Divergence options, combinable with commas (later verl releases).
pub(super) const OPTIONS: &[&str] = &[
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
];

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let Some(rs) = ctx
        .config
        .algorithm
        .rollout_correction
        .rollout_rs
        .as_deref()
    else {
        return;
    };
    let trimmed = rs.trim();
    if LEVELS.contains(&trimmed) {
        return;
    }
    let key = "algorithm.rollout_correction.rollout_rs";
    let parts: Vec<&str> = trimmed
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if parts.is_empty() {
        out.push(
            Diagnostic::error(
                CODE,
                "`rollout_rs` is empty; it must name a rejection-sampling mode",
            )
            .with_key(key)
            .with_primary(ctx.origin(key), "empty")
            .with_help(format!(
                "use null to turn rejection sampling off, or one of {}",
                LEVELS.join(", ")
            )),
        );
        return;
    }
    for part in parts {
        if OPTIONS.contains(&part) {
            continue;
        }
        let all = LEVELS.iter().chain(OPTIONS.iter()).copied();
        let help = match did_you_mean(part, all) {
            Some(s) => format!("did you mean `{s}`?"),
            None => format!(
                "use one of {} or a comma list of {}",
                LEVELS.join(", "),
                OPTIONS.join(", ")
            ),
        };
        out.push(
            Diagnostic::error(
                CODE,
                format!("unknown rejection-sampling option `{part}` in rollout_rs"),
            )
            .with_key(key)
            .with_primary(ctx.origin(key), format!("`{part}` is not an option"))
            .with_help(help),
        );
    }
}
