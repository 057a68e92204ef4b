//! Rollout correction in verl's decoupled mode (`algorithm.rollout_correction`,
//! `compute_rollout_correction_and_rejection_mask`): the rollout engine's log-probs differ from
//! the trainer's (another kernel, another precision), so with `log_ratio = old − rollout`:
//!
//! - importance weights (`rollout_is`): `exp(clamp(log_ratio, ±20))` per token, or per
//!   sequence of the summed log-ratio, zero outside the response, truncated at
//!   `rollout_is_threshold` (or, verl 0.8+'s IcePop, zeroed outside `"lower_upper"`) and
//!   optionally divided by their masked mean (`batch_normalize`); the actor's policy loss
//!   multiplies by them;
//! - rejection (`rollout_rs`): tokens (or whole sequences, by the product or the geometric mean
//!   of their ratios) whose ratio leaves `[lower, upper]` leave the response mask;
//! - veto (`rollout_token_veto_threshold`): a sequence with any token ratio below the threshold
//!   leaves the mask entirely.
//!
//! In bypass mode ([`bypass_policy_loss`]) the same correction runs per micro-batch between the
//! current policy and the rollout's, inside verl's `bypass_mode` policy loss.
//!
//! The metrics are verl's (`rollout_corr/…`), as the release computes them
//! ([`CorrectionForm`]): 0.7's weights' mean, max, min, std, effective sample size and
//! out-of-range fractions before truncation, the rejected token and sequence fractions, the
//! veto fractions (not its per-sequence `rollout_is_seq_*`); 0.8+'s every importance-weight
//! metric (the applied weights' statistics, the raw weights' out-of-range fractions, the
//! per-sequence `rollout_is_seq_*`, IcePop's `rollout_is_oob_ratio`). Neither release's
//! off-policy KL/perplexity diagnostics.

use std::collections::BTreeMap;

use tch::{Kind, Tensor};
use verlc_spec::trainer::{
    BypassLoss, BypassSpec, CorrectionForm, IsLevel, RolloutCorrectionSpec, RsLevel,
};

use super::masked::{masked_mean, masked_mean_dim, masked_sum_dim};
use super::{
    AggOptions, AlgoError, LossAggMode, PolicyLossConfig, PolicyLossInputs, PolicyLossMode,
    agg_loss, compute_policy_loss, item,
};

const SAFETY_BOUND: f64 = 20.0;

/// What the correction gives the batch.
#[derive(Debug)]
pub struct RolloutCorrection {
    /// `rollout_is_weights` (N, R), when `rollout_is` is set.
    pub weights: Option<Tensor>,
    /// The response mask with rejected tokens removed.
    pub response_mask: Tensor,
    pub metrics: BTreeMap<String, f64>,
}

/// Per-token or per-sequence ratio weights `exp(clamp(·, ±20))` broadcast to (N, R), and the
/// log-ratio the metrics read.
fn ratio_weights(
    log_ratio: &Tensor,
    mask: &Tensor,
    per_sequence: Option<bool>,
) -> Result<Tensor, AlgoError> {
    let lr = match per_sequence {
        None => log_ratio.shallow_clone(),
        Some(geometric) => {
            let agg = if geometric {
                masked_mean_dim(log_ratio, mask, -1)?
            } else {
                masked_sum_dim(log_ratio, mask, -1)?
            };
            agg.f_unsqueeze(-1)?.f_expand_as(log_ratio)?
        }
    };
    Ok(lr.f_clamp(-SAFETY_BOUND, SAFETY_BOUND)?.f_exp()?)
}

/// verl's `compute_is_metrics` as the release computes it. 0.7: the batch-level statistics of
/// the untruncated weights `raw` (std and effective sample size clamped to
/// `[1 / upper, upper]`; not its `rollout_is_seq_*`). 0.8+: those of the applied weights `w`
/// (truncated, or IcePop's zeroed; clamped to `[0, upper]`), the out-of-range fractions of
/// `raw` (the lower bound IcePop's, else `1 / upper`), and the per-sequence means' statistics.
fn is_metrics(
    (w, raw): (&Tensor, &Tensor),
    log_ratio: &Tensor,
    mask: &Tensor,
    level: IsLevel,
    (upper, lower): (f64, Option<f64>),
    form: CorrectionForm,
) -> Result<Vec<(&'static str, f64)>, AlgoError> {
    let newer = form == CorrectionForm::Verl08;
    let lower = lower.unwrap_or(1.0 / upper);
    // What the statistics describe.
    let stats = if newer { w } else { raw };
    let frac = |t: Tensor| -> Result<f64, AlgoError> {
        item(&masked_mean(&t.f_to_kind(Kind::Float)?, mask)?)
    };
    let share = |t: Tensor| -> Result<f64, AlgoError> {
        item(&t.f_to_kind(Kind::Float)?.f_mean(Kind::Float)?)
    };
    let mut out = vec![("rollout_is_mean", item(&masked_mean(stats, mask)?)?)];
    match level {
        IsLevel::Sequence => {
            // Over the per-sequence log-ratios (N,), unmasked, as verl.
            let seq = masked_sum_dim(log_ratio, mask, -1)?;
            out.push((
                "rollout_is_max",
                item(&seq.f_max()?.f_clamp_max(SAFETY_BOUND)?.f_exp()?)?,
            ));
            out.push(("rollout_is_min", item(&seq.f_min()?.f_exp()?)?));
            out.push((
                "rollout_is_ratio_fraction_high",
                share(seq.f_gt(upper.ln())?)?,
            ));
            out.push((
                "rollout_is_ratio_fraction_low",
                share(seq.f_lt(lower.ln())?)?,
            ));
        }
        IsLevel::Token => {
            out.push(("rollout_is_ratio_fraction_high", frac(raw.f_gt(upper)?)?));
            out.push(("rollout_is_ratio_fraction_low", frac(raw.f_lt(lower)?)?));
            let valid = mask.f_gt(0.0)?;
            let kept = stats.f_masked_select(&valid)?;
            out.push(("rollout_is_max", item(&kept.f_max()?)?));
            out.push(("rollout_is_min", item(&kept.f_min()?)?));
        }
    }
    let clamped = stats.f_clamp(if newer { 0.0 } else { lower }, upper)?;
    let mean = masked_mean(&clamped, mask)?;
    let std = if item(&mask.f_sum(Kind::Float)?)? > 1.0 {
        let var = item(&masked_mean(&clamped.f_square()?, mask)?)? - item(&mean)?.powi(2);
        var.max(0.0).sqrt()
    } else {
        0.0
    };
    out.push(("rollout_is_std", std));
    let normalized = clamped.f_div(&mean.f_add_scalar(1e-8)?)?;
    out.push((
        "rollout_is_eff_sample_size",
        1.0 / item(&masked_mean(&normalized.f_square()?, mask)?)?,
    ));
    if !newer {
        return Ok(out);
    }
    let seq_mean = masked_mean_dim(w, mask, -1)?;
    let rows = seq_mean.numel();
    out.push(("rollout_is_seq_mean", item(&seq_mean.f_mean(Kind::Float)?)?));
    out.push((
        "rollout_is_seq_std",
        if rows > 1 {
            item(&seq_mean.f_std(true)?)?
        } else {
            0.0
        },
    ));
    out.push(("rollout_is_seq_max", item(&seq_mean.f_max()?)?));
    out.push(("rollout_is_seq_min", item(&seq_mean.f_min()?)?));
    out.push((
        "rollout_is_seq_max_deviation",
        item(&seq_mean.f_sub_scalar(1.0)?.f_abs()?.f_max()?)?,
    ));
    // From the raw means: a mean of truncated weights never exceeds the bound.
    let raw_seq_mean = masked_mean_dim(raw, mask, -1)?;
    out.push((
        "rollout_is_seq_fraction_high",
        share(raw_seq_mean.f_gt(upper)?)?,
    ));
    out.push((
        "rollout_is_seq_fraction_low",
        share(raw_seq_mean.f_lt(lower)?)?,
    ));
    Ok(out)
}

/// Applies `spec` to a batch's `old_log_probs`, `rollout_log_probs` and `response_mask`.
pub fn rollout_correction(
    old_log_prob: &Tensor,
    rollout_log_prob: &Tensor,
    response_mask: &Tensor,
    spec: &RolloutCorrectionSpec,
) -> Result<RolloutCorrection, AlgoError> {
    let mask = response_mask.f_to_kind(Kind::Float)?;
    if item(&mask.f_sum(Kind::Float)?)? <= 0.0 {
        return Err(AlgoError::Data(
            "rollout correction: the response mask has no valid token".into(),
        ));
    }
    let log_ratio = old_log_prob
        .f_to_kind(Kind::Float)?
        .f_sub(&rollout_log_prob.f_to_kind(Kind::Float)?)?;
    let mut metrics = BTreeMap::new();
    let mut put = |k: &str, v: f64| {
        metrics.insert(format!("rollout_corr/{k}"), v);
    };

    let weights = match spec.is_level {
        None => None,
        Some(level) => {
            let per_sequence = (level == IsLevel::Sequence).then_some(false);
            let raw = ratio_weights(&log_ratio, &mask, per_sequence)?.f_mul(&mask)?;
            let upper = spec.is_threshold;
            let mut w = match spec.is_threshold_lower {
                None => raw.f_clamp_max(upper)?,
                // IcePop: weights outside the bounds drop to zero.
                Some(lower) => {
                    let kept = raw.f_ge(lower)?.f_logical_and(&raw.f_le(upper)?)?;
                    raw.f_where_self(&kept, &raw.f_zeros_like()?)?
                }
            };
            let metrics = is_metrics(
                (&w, &raw),
                &log_ratio,
                &mask,
                level,
                (upper, spec.is_threshold_lower),
                spec.form,
            )?;
            for (k, v) in metrics {
                put(k, v);
            }
            if let Some(lower) = spec.is_threshold_lower {
                let out = raw.f_lt(lower)?.f_logical_or(&raw.f_gt(upper)?)?;
                put(
                    "rollout_is_oob_ratio",
                    item(&masked_mean(&out.f_to_kind(Kind::Float)?, &mask)?)?,
                );
            }
            if spec.is_batch_normalize {
                let mean = match level {
                    IsLevel::Token => item(&masked_mean(&w, &mask)?)?,
                    IsLevel::Sequence => {
                        let seq = masked_mean_dim(&w, &mask, -1)?;
                        let seq_mask = mask
                            .f_sum_dim_intlist(-1i64, false, Kind::Float)?
                            .f_gt(0.0)?
                            .f_to_kind(Kind::Float)?;
                        item(&seq.f_mul(&seq_mask)?.f_sum(Kind::Float)?)?
                            / item(&seq_mask.f_sum(Kind::Float)?)?.max(1e-8)
                    }
                };
                if mean > 1e-8 {
                    w = w.f_div_scalar(mean)?;
                    put("rollout_is_batch_norm_factor", mean);
                } else {
                    put("rollout_is_batch_norm_factor", 1.0);
                }
            }
            Some(w.f_detach()?)
        }
    };

    let mut new_mask = mask.shallow_clone();
    if let Some(rs) = spec.rejection {
        let per_sequence = match rs.level {
            RsLevel::Token => None,
            RsLevel::Sequence => Some(false),
            RsLevel::Geometric => Some(true),
        };
        let w = ratio_weights(&log_ratio, &mask, per_sequence)?;
        let keep = w
            .f_ge(rs.lower)?
            .f_logical_and(&w.f_le(rs.upper)?)?
            .f_to_kind(Kind::Float)?;
        let rejected = keep.f_neg()?.f_add_scalar(1.0)?;
        put(
            "rollout_rs_masked_fraction",
            item(&masked_mean(&rejected, &mask)?)?,
        );
        let seq_rejected = match rs.level {
            RsLevel::Token => masked_sum_dim(&rejected, &mask, -1)?
                .f_gt(0.0)?
                .f_to_kind(Kind::Float)?
                .f_mean(Kind::Float)?,
            _ => rejected.f_select(1, 0)?.f_mean(Kind::Float)?,
        };
        put("rollout_rs_seq_masked_fraction", item(&seq_rejected)?);
        new_mask = mask.f_mul(&keep)?;
    }

    if !spec.criteria.is_empty() {
        // verl 0.9's options, from the same ratio and the original mask.
        let (keep, m) = super::rejection::rejection_mask(&log_ratio, &mask, &spec.criteria)?;
        for (k, v) in m {
            put(&k, v);
        }
        new_mask = new_mask.f_mul(&keep)?;
    }

    match spec.veto_threshold {
        Some(t) => {
            let catastrophic = log_ratio.f_lt(t.ln())?.f_logical_and(&mask.f_gt(0.0)?)?;
            let any = catastrophic.f_any_dim(-1, true)?;
            put(
                "rollout_is_veto_fraction",
                item(&any.f_to_kind(Kind::Float)?.f_mean(Kind::Float)?)?,
            );
            put(
                "rollout_is_catastrophic_token_fraction",
                item(&masked_mean(&catastrophic.f_to_kind(Kind::Float)?, &mask)?)?,
            );
            new_mask = new_mask.f_mul(&any.f_logical_not()?.f_to_kind(Kind::Float)?)?;
        }
        // verl 0.8 dropped the veto, and its metrics with it.
        None if spec.form == CorrectionForm::Verl08 => {}
        None => {
            put("rollout_is_veto_fraction", 0.0);
            put("rollout_is_catastrophic_token_fraction", 0.0);
        }
    }
    Ok(RolloutCorrection {
        weights,
        response_mask: new_mask.f_to_kind(response_mask.kind())?,
        metrics,
    })
}

/// verl's `bypass_mode` policy loss (`compute_policy_loss_bypass_mode`): `inputs.old_log_prob`
/// is the rollout's log-prob; the correction of `b` runs without gradient between the current
/// and the rollout policy, then PPO's clipped loss on the corrected mask without weights
/// (`ppo_clip`) or `−A · log π · w` (`reinforce`, aggregated over the corrected mask). Returns
/// the loss and its metrics (`actor/*` and `rollout_corr/*`).
pub fn bypass_policy_loss(
    b: &BypassSpec,
    inputs: &PolicyLossInputs<'_>,
    cfg: &PolicyLossConfig,
    mode: LossAggMode,
    agg: &AggOptions,
) -> Result<(Tensor, BTreeMap<String, f64>), AlgoError> {
    let (rollout, log_prob) = (inputs.old_log_prob, inputs.log_prob);
    let c = tch::no_grad(|| {
        rollout_correction(
            &log_prob.detach(),
            rollout,
            inputs.response_mask,
            &b.correction,
        )
    })?;
    let effective = c.response_mask;
    let mut metrics = c.metrics;
    let loss = match b.loss {
        BypassLoss::PpoClip => {
            let plain = PolicyLossInputs::new(rollout, log_prob, inputs.advantages, &effective);
            let pg = compute_policy_loss(PolicyLossMode::Vanilla, &plain, cfg, mode, agg)?;
            for (k, v) in pg.metrics.named()? {
                metrics.insert(k.to_owned(), v);
            }
            pg.loss
        }
        BypassLoss::Reinforce => {
            let mut losses = inputs.advantages.f_neg()?.f_mul(log_prob)?;
            if let Some(w) = &c.weights {
                losses = losses.f_mul(w)?;
            }
            let kl = masked_mean(&rollout.f_sub(log_prob)?.f_detach()?, &effective)?;
            metrics.insert("actor/ppo_kl".into(), item(&kl)?);
            agg_loss(&losses, &effective, mode, agg)?
        }
    };
    Ok((loss, metrics))
}
