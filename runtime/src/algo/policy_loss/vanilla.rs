//! `vanilla`: the PPO clipped surrogate (Schulman et al. 2017) with dual clipping for negative
//! advantages (Ye et al. 2020, arXiv:1912.09729).
//!
//! `ℓ1 = −Aρ`, `ℓ2 = −A·clip(ρ, 1−ε_l, 1+ε_h)`, `ℓc = max(ℓ1, ℓ2)`; for `A < 0` the loss is
//! capped at `−A·c`: `ℓ = min(−A·c, ℓc)`, else `ℓ = ℓc`. Metrics: `pg_clipfrac =
//! mean_m[ℓ2 > ℓ1]`, `ppo_kl = mean_m(−Δ)` (clamped Δ), `pg_clipfrac_lower = mean_m[ℓc > −A·c
//! ∧ A < 0]`.
use super::{
    PolicyLoss, PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, clamped_log_ratio,
    detached_mean, fraction, invalid,
};
use crate::algo::Result;
use crate::algo::agg::{AggOptions, LossAggMode, agg_loss};

pub fn compute(
    inputs: &PolicyLossInputs<'_>,
    cfg: &PolicyLossConfig,
    agg_mode: LossAggMode,
    agg: &AggOptions,
) -> Result<PolicyLoss> {
    if cfg.clip_ratio_c.is_nan() || cfg.clip_ratio_c <= 1.0 {
        return Err(invalid(format!(
            "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0, but get the value: {}.",
            cfg.clip_ratio_c
        )));
    }
    inputs.validate()?;
    let mask = inputs.mask()?;
    let adv = inputs.advantages;
    let (neg_kl, ratio) = clamped_log_ratio(inputs)?;
    let ppo_kl = detached_mean(&neg_kl.f_neg()?, &mask)?;

    let neg_adv = adv.f_neg()?;
    let loss1 = neg_adv.f_mul(&ratio)?;
    let loss2 = neg_adv.f_mul(&ratio.f_clamp(1.0 - cfg.clip_low(), 1.0 + cfg.clip_high())?)?;
    let clipped1 = loss1.f_maximum(&loss2)?;
    let pg_clipfrac = fraction(&loss2.f_gt_tensor(&loss1)?, &mask)?;

    let loss3 = neg_adv.f_mul_scalar(cfg.clip_ratio_c)?;
    let clipped2 = loss3.f_minimum(&clipped1)?;
    let negative = adv.f_lt(0.0)?;
    let pg_clipfrac_lower = fraction(
        &clipped1.f_gt_tensor(&loss3)?.f_logical_and(&negative)?,
        &mask,
    )?;

    let pg_losses = inputs.weighted(clipped2.f_where_self(&negative, &clipped1)?)?;
    let loss = agg_loss(&pg_losses, &mask, agg_mode, agg)?;
    Ok(PolicyLoss {
        loss,
        metrics: PolicyLossMetrics {
            pg_clipfrac: Some(pg_clipfrac),
            ppo_kl: Some(ppo_kl),
            pg_clipfrac_lower: Some(pg_clipfrac_lower),
        },
    })
}
