//! ## What it checks
//! With rejection sampling on (`algorithm.rollout_correction.rollout_rs` set),
//! `rollout_rs_threshold` must be given and well formed: a positive number for the single
//! levels (`token`, `sequence`, `geometric`); for a list of divergence options, one positive
//! threshold shared by all or one per option (comma-separated), where `*_k1` options may give
//! `lower_upper` bounds and the others a single upper bound.
//!
//! ## Why
//! verl raises when it first computes the rejection mask ("rollout_rs_threshold must be
//! provided for rejection sampling.", "rollout_rs_threshold expects either one threshold …",
//! "Invalid numeric threshold …"), after a full rollout.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   rollout_correction:
//!     rollout_rs: token
//!     rollout_rs_threshold: null
//! ```
//!
//! ## Fix
//! Give a threshold, e.g. `rollout_rs_threshold: 2.0`.

use crate::config::RatioThreshold;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

use super::rejection_sampling_option_unknown::{LEVELS, OPTIONS};

const CODE: Code = Code("V030");
const KEY: &str = "algorithm.rollout_correction.rollout_rs_threshold";

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let rc = &ctx.config.algorithm.rollout_correction;
    let Some(rs) = rc.rollout_rs.as_deref() else {
        return;
    };
    let rs = rs.trim();
    let options: Vec<&str> = rs
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    // Unknown names are V029's finding.
    let level = LEVELS.contains(&rs);
    if !level && (options.is_empty() || options.iter().any(|o| !OPTIONS.contains(o))) {
        return;
    }
    let problem = match &rc.rollout_rs_threshold {
        None => Some("rejection sampling is on but `rollout_rs_threshold` is null".to_owned()),
        Some(RatioThreshold::Number(x)) if *x <= 0.0 => {
            Some(format!("`rollout_rs_threshold` must be positive, got {x}"))
        }
        Some(RatioThreshold::Number(_)) => None,
        Some(RatioThreshold::Text(t)) if level => match t.trim().parse::<f64>() {
            Ok(x) if x > 0.0 => None,
            _ => Some(format!(
                "`rollout_rs_threshold` must be a positive number for rollout_rs `{rs}`, got `{t}`"
            )),
        },
        Some(RatioThreshold::Text(t)) => text_problem(t, &options),
    };
    let Some(message) = problem else { return };
    out.push(
        Diagnostic::error(CODE, message)
            .with_key(KEY)
            .with_primary(ctx.origin(KEY), "threshold set here")
            .with_secondary(ctx.origin("algorithm.rollout_correction.rollout_rs"), format!("rejection sampling `{rs}`"))
            .with_help(if level {
                "give a positive upper bound on the importance ratio, e.g. `rollout_rs_threshold: 2.0`".to_owned()
            } else {
                "give one positive threshold, or one per option separated by commas (`lower_upper` for *_k1 options)".to_owned()
            }),
    );
}

/// Checks a per-option threshold list the way later verl releases parse it.
fn text_problem(text: &str, options: &[&str]) -> Option<String> {
    let specs: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if specs.is_empty() {
        return Some("`rollout_rs_threshold` is empty".to_owned());
    }
    if specs.len() != 1 && specs.len() != options.len() {
        return Some(format!(
            "`rollout_rs_threshold` has {} entries for {} rollout_rs options; give one shared threshold or one per option",
            specs.len(),
            options.len()
        ));
    }
    for (i, option) in options.iter().enumerate() {
        let spec = if specs.len() == 1 { specs[0] } else { specs[i] };
        let bounds: Vec<&str> = if option.ends_with("k1") {
            spec.splitn(2, '_').collect()
        } else {
            vec![spec]
        };
        let ok = bounds
            .iter()
            .all(|b| b.parse::<f64>().is_ok_and(|x| x > 0.0));
        if !ok {
            return Some(format!(
                "threshold `{spec}` for option `{option}` is not a positive number{}",
                if option.ends_with("k1") {
                    " or `lower_upper` pair"
                } else {
                    ""
                }
            ));
        }
    }
    None
}
