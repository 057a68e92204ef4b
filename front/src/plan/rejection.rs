//! verl 0.9's rejection-sampling options (`algorithm.rollout_correction.rollout_rs`, its
//! `compute_rollout_rejection_mask`): a comma-separated list of `{token,seq_sum,seq_mean,
//! seq_max}_{k1,k2,k3}` (no `seq_max_k1`), duplicates dropped, and `rollout_rs_threshold`: one
//! spec shared by every option or one per option, `lower_upper` or a bare upper bound (its
//! reciprocal the lower) for `k1`, a single positive upper bound for `k2`/`k3`. What verl raises
//! on is refused at the key with verl's reason.
use verlc_spec::algo::KlKind;
use verlc_spec::trainer::{RsAggregate, RsCriterion};

use super::spec::Lowering;
use crate::config::algorithm::RatioThreshold;
use crate::load::interp::py_float;

const KEY: &str = "algorithm.rollout_correction.rollout_rs";
const THRESHOLD_KEY: &str = "algorithm.rollout_correction.rollout_rs_threshold";

/// The option `name`'s aggregation and estimator, if verl 0.9 accepts it.
fn option(name: &str) -> Option<(RsAggregate, KlKind)> {
    let (aggregate, estimator) = name.rsplit_once('_')?;
    let aggregate = match aggregate {
        "token" => RsAggregate::Token,
        "seq_sum" => RsAggregate::SeqSum,
        "seq_mean" => RsAggregate::SeqMean,
        "seq_max" => RsAggregate::SeqMax,
        _ => return None,
    };
    let estimator = match estimator {
        "k1" if aggregate != RsAggregate::SeqMax => KlKind::K1,
        "k2" => KlKind::K2,
        "k3" => KlKind::K3,
        _ => return None,
    };
    Some((aggregate, estimator))
}

pub(super) fn criteria(
    options: &str,
    threshold: Option<&RatioThreshold>,
    l: &mut Lowering,
) -> Option<Vec<RsCriterion>> {
    let mut names: Vec<&str> = Vec::new();
    for part in options.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if option(part).is_none() {
            l.unsupported(
                KEY,
                format!("`{part}` is not a rejection-sampling option of verl 0.9 (it raises)"),
                "use {token,seq_sum,seq_mean}_{k1,k2,k3} or seq_max_{k2,k3}, comma-separated",
            );
            return None;
        }
        if !names.contains(&part) {
            names.push(part);
        }
    }
    if names.is_empty() {
        l.unsupported(
            KEY,
            "rollout_rs names no option (verl raises)",
            "name at least one option",
        );
        return None;
    }
    let specs: Vec<String> = match threshold {
        None => {
            l.unsupported(
                THRESHOLD_KEY,
                "rejection sampling needs rollout_rs_threshold (verl raises without it)",
                "set one threshold for all options, or one per option",
            );
            return None;
        }
        // verl splits `str(x)` of a number.
        Some(RatioThreshold::Number(x)) => vec![py_float(*x)],
        Some(RatioThreshold::Text(t)) => t
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect(),
    };
    if specs.is_empty() || (specs.len() != 1 && specs.len() != names.len()) {
        l.unsupported(
            THRESHOLD_KEY,
            format!(
                "rollout_rs_threshold expects either one threshold shared by all options or exactly {} thresholds to match the provided rollout_rs options",
                names.len()
            ),
            "give one threshold, or one per option in order",
        );
        return None;
    }
    let mut out = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let spec = specs
            .get(i)
            .or(specs.first())
            .map(String::as_str)
            .unwrap_or("");
        let (aggregate, estimator) = option(name)?;
        let bad = |l: &mut Lowering, why: String| {
            l.unsupported(
                THRESHOLD_KEY,
                why,
                "k1 options take lower_upper or an upper bound; k2/k3 a positive upper bound",
            );
        };
        let number = |s: &str| s.trim().parse::<f64>().ok();
        let (lower, upper) = if estimator == KlKind::K1 {
            let (lo, hi) = match spec.split_once('_') {
                Some((lo, hi)) => (number(lo), number(hi)),
                None => (number(spec).map(|u| 1.0 / u), number(spec)),
            };
            let (Some(lo), Some(hi)) = (lo, hi) else {
                bad(
                    l,
                    format!("Invalid numeric threshold '{spec}' for option '{name}'"),
                );
                return None;
            };
            if lo <= 0.0 || hi <= 0.0 {
                bad(
                    l,
                    format!("Thresholds for option '{name}' must be positive, got {spec}"),
                );
                return None;
            }
            if lo > hi {
                bad(
                    l,
                    format!("Thresholds for option '{name}' must be lower <= upper, got {spec}"),
                );
                return None;
            }
            (Some(lo), hi)
        } else {
            if spec.contains('_') {
                bad(
                    l,
                    format!(
                        "rollout_rs_threshold for option '{name}' must provide a single upper bound without '_'. Received '{spec}'"
                    ),
                );
                return None;
            }
            let Some(hi) = number(spec) else {
                bad(
                    l,
                    format!("Invalid numeric threshold '{spec}' for option '{name}'"),
                );
                return None;
            };
            if hi <= 0.0 {
                bad(
                    l,
                    format!("Threshold for option '{name}' must be positive, got {spec}"),
                );
                return None;
            }
            (None, hi)
        };
        out.push(RsCriterion {
            name: (*name).to_owned(),
            aggregate,
            estimator,
            lower,
            upper,
        });
    }
    Some(out)
}
