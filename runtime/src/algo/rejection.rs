//! verl 0.9's rejection sampling (`rollout_rs` options, its `compute_rollout_rejection_mask`
//! and `compute_rs_metrics`): per option a statistic of `l = clamp(log π_train − log π_rollout,
//! ±20)` per token (`k1 = −l`, `k2 = ½l²`, `k3 = eˡ − 1 − l`), or its masked sum, mean or maximum
//! over the sequence; a token is kept when every option keeps it (`k1` within `[ln lower,
//! ln upper]`, the others at or below `upper`; a sequence option keeps or rejects its whole
//! row). Rejected tokens leave the response mask; nothing leaves the batch.
use tch::{Kind, Tensor};

use super::masked::{masked_mean, masked_mean_dim, masked_sum_dim};
use super::{AlgoError, KlKind, item};

pub use verlc_spec::trainer::{RsAggregate, RsCriterion};

/// verl's `SAFETY_BOUND` on the log-ratio.
const SAFETY_BOUND: f64 = 20.0;

/// The kept tokens (`1`/`0`, the dtype of `log_ratio`, padding included as kept: multiply by the
/// mask) and the metrics, named as verl's (without the `rollout_corr/` prefix).
pub fn rejection_mask(
    log_ratio: &Tensor,
    response_mask: &Tensor,
    criteria: &[RsCriterion],
) -> Result<(Tensor, Vec<(String, f64)>), AlgoError> {
    let kind = log_ratio.kind();
    let mask = response_mask.f_to_kind(kind)?;
    let mask_bool = response_mask.f_to_kind(Kind::Bool)?;
    if mask_bool.f_any()?.f_int64_value(&[])? == 0 {
        return Err(AlgoError::Data(
            "rejection sampling: the response mask has no valid token".into(),
        ));
    }
    let seq_valid = mask.f_sum_dim_intlist(-1i64, false, kind)?.f_gt(0.0)?;
    let l = log_ratio.f_clamp(-SAFETY_BOUND, SAFETY_BOUND)?;
    let mut combined = mask.f_ones_like()?;
    let mut metrics = Vec::new();
    for c in criteria {
        let token_stat = match c.estimator {
            KlKind::K1 => l.f_neg()?,
            KlKind::K2 => l.f_square()?.f_mul_scalar(0.5)?,
            KlKind::K3 => l.f_exp()?.f_sub_scalar(1.0)?.f_sub(&l)?,
            other => {
                return Err(AlgoError::Unsupported(format!(
                    "rejection option {}: estimator {other:?}",
                    c.name
                )));
            }
        };
        let k1 = c.estimator == KlKind::K1;
        let (lo, hi) = match (k1, c.lower) {
            (true, Some(lower)) => (lower.ln(), c.upper.ln()),
            (true, None) => {
                return Err(AlgoError::Unsupported(format!(
                    "rejection option {}: k1 needs a lower bound",
                    c.name
                )));
            }
            (false, _) => (0.0, c.upper),
        };
        let keep_of = |stat: &Tensor| -> Result<Tensor, AlgoError> {
            Ok(if k1 {
                stat.f_ge(lo)?.f_logical_and(&stat.f_le(hi)?)?
            } else {
                stat.f_le(c.upper)?
            })
        };
        let (per_token, per_sequence, keep) = match c.aggregate {
            RsAggregate::Token => (token_stat.shallow_clone(), None, keep_of(&token_stat)?),
            aggregate => {
                let seq = match aggregate {
                    RsAggregate::SeqSum => masked_sum_dim(&token_stat, &mask, -1)?,
                    RsAggregate::SeqMean => masked_mean_dim(&token_stat, &mask, -1)?,
                    _ => {
                        let filled = token_stat
                            .f_masked_fill(&mask_bool.f_logical_not()?, f64::NEG_INFINITY)?;
                        let max = filled.f_amax(-1, false)?;
                        max.f_masked_fill(&max.f_eq(f64::NEG_INFINITY)?, 0.0)?
                    }
                };
                let keep = keep_of(&seq)?.f_unsqueeze(-1)?.f_expand_as(&mask_bool)?;
                let broadcast = seq.f_unsqueeze(-1)?.f_expand_as(&mask)?;
                (broadcast, Some(seq), keep)
            }
        };
        let token_keep = keep.f_to_kind(kind)?;
        combined = combined.f_mul(&token_keep)?;
        let rejected_valid = keep.f_logical_not()?.f_logical_and(&mask_bool)?;
        let seq_keep = rejected_valid.f_any_dim(-1, false)?.f_logical_not()?;
        let prefix = format!("rollout_rs_{}", c.name);
        let stats = OptionStats {
            per_token: &per_token,
            per_sequence: per_sequence.as_ref(),
            mask: &mask,
            seq_valid: &seq_valid,
            upper: hi,
            lower: k1.then_some(lo),
        };
        for (k, v) in stats.metrics()? {
            metrics.push((format!("{prefix}_{k}"), v));
        }
        metrics.push((
            format!("{prefix}_masked_fraction"),
            item(&masked_mean(
                &token_keep.f_neg()?.f_add_scalar(1.0)?,
                &mask,
            )?)?,
        ));
        let valid = seq_valid.f_to_kind(kind)?;
        let n_valid = item(&valid.f_sum(kind)?)?;
        let seq_masked = if n_valid > 0.0 {
            let dropped = seq_keep.f_to_kind(kind)?.f_neg()?.f_add_scalar(1.0)?;
            item(&dropped.f_mul(&valid)?.f_sum(kind)?)? / n_valid
        } else {
            0.0
        };
        metrics.push((format!("{prefix}_seq_masked_fraction"), seq_masked));
    }
    metrics.push((
        "rollout_rs_masked_fraction".into(),
        item(&masked_mean(&combined.f_neg()?.f_add_scalar(1.0)?, &mask)?)?,
    ));
    let final_keep = combined.f_gt(0.5)?.f_logical_and(&mask_bool)?;
    let has_masked = final_keep
        .f_logical_not()?
        .f_logical_and(&mask_bool)?
        .f_any_dim(-1, false)?;
    metrics.push((
        "rollout_rs_seq_masked_fraction".into(),
        item(&has_masked.f_to_kind(Kind::Float)?.f_mean(Kind::Float)?)?,
    ));
    Ok((combined, metrics))
}

/// One option's statistic and thresholds (`k1`'s in log space), for verl's per-option metrics.
struct OptionStats<'a> {
    per_token: &'a Tensor,
    per_sequence: Option<&'a Tensor>,
    mask: &'a Tensor,
    seq_valid: &'a Tensor,
    upper: f64,
    /// `k1` only.
    lower: Option<f64>,
}

impl OptionStats<'_> {
    fn metrics(&self) -> Result<Vec<(&'static str, f64)>, AlgoError> {
        let (stat, mask) = (self.per_token, self.mask);
        let kind = stat.kind();
        let mask_bool = mask.f_to_kind(Kind::Bool)?;
        let seq_values = match self.per_sequence {
            Some(s) => s.shallow_clone(),
            None => masked_mean_dim(stat, mask, -1)?,
        };
        let seq = seq_values.f_masked_select(self.seq_valid)?;
        let n = seq.numel();
        let sequence_level = self.per_sequence.is_some() && n > 0;
        // verl takes these fractions of `.float()` booleans: in f32.
        let frac = |t: Tensor| -> Result<f64, AlgoError> {
            item(&t.f_to_kind(Kind::Float)?.f_mean(Kind::Float)?)
        };
        let mut out = vec![("mean", item(&masked_mean(stat, mask)?)?)];
        if sequence_level {
            out.push(("max", item(&seq.f_max()?)?));
            out.push(("min", item(&seq.f_min()?)?));
            out.push(("fraction_high", frac(seq.f_gt(self.upper)?)?));
            out.push((
                "fraction_low",
                match self.lower {
                    Some(lo) => frac(seq.f_lt(lo)?)?,
                    None => 0.0,
                },
            ));
        } else {
            let not_mask = mask_bool.f_logical_not()?;
            out.push((
                "max",
                item(&stat.f_masked_fill(&not_mask, f64::NEG_INFINITY)?.f_max()?)?,
            ));
            out.push((
                "min",
                item(&stat.f_masked_fill(&not_mask, f64::INFINITY)?.f_min()?)?,
            ));
            let masked_frac = |t: Tensor| -> Result<f64, AlgoError> {
                item(&masked_mean(&t.f_to_kind(kind)?, mask)?)
            };
            out.push(("fraction_high", masked_frac(stat.f_gt(self.upper)?)?));
            out.push((
                "fraction_low",
                match self.lower {
                    Some(lo) => masked_frac(stat.f_lt(lo)?)?,
                    None => 0.0,
                },
            ));
        }
        let std = if item(&mask.f_sum(kind)?)? > 1.0 {
            let clamped = stat.f_clamp(self.lower.unwrap_or(0.0), self.upper)?;
            let mean = masked_mean(&clamped, mask)?;
            let var = masked_mean(&clamped.f_square()?, mask)?.f_sub(&mean.f_square()?)?;
            item(&var.f_clamp_min(0.0)?.f_sqrt()?)?
        } else {
            0.0
        };
        out.push(("std", std));
        if n > 0 {
            out.push(("seq_mean", item(&seq.f_mean(kind)?)?));
            let seq_std = if n > 1 { item(&seq.f_std(true)?)? } else { 0.0 };
            out.push(("seq_std", seq_std));
            out.push(("seq_max", item(&seq.f_max()?)?));
            out.push(("seq_min", item(&seq.f_min()?)?));
            out.push(("seq_max_deviation", item(&seq.f_abs()?.f_max()?)?));
            out.push(("seq_fraction_high", frac(seq.f_gt(self.upper)?)?));
            if let Some(lo) = self.lower {
                out.push(("seq_fraction_low", frac(seq.f_lt(lo)?)?));
            }
        } else {
            for k in [
                "seq_mean",
                "seq_std",
                "seq_max",
                "seq_min",
                "seq_max_deviation",
                "seq_fraction_high",
                "seq_fraction_low",
            ] {
                out.push((k, 0.0));
            }
        }
        Ok(out)
    }
}
