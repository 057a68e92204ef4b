//! `gspo`: group sequence policy optimisation (Zheng et al. 2025, arXiv:2507.18071).
//!
//! Sequence ratio `s_i = exp(Σ_t mΔ / max(Σ_t m, 1))`; per token
//! `log ρ̃ = log π_θ − sg(log π_θ) + sg(log s_i)`, clamped at 10 — the value of `s_i` with the
//! gradient of each token's own log-prob. `ℓ = max(−Aρ̃, −A·clip(ρ̃, 1−ε_l, 1+ε_h))`,
//! aggregated with the configured `loss_agg_mode` (verl 0.9.1 on; `seq-mean-token-mean`
//! before). Metrics: `pg_clipfrac = mean_m[ℓ2 > ℓ1]`,
//! `ppo_kl = mean_m(−Δ)` (Δ unclamped), `pg_clipfrac_lower = 0`.
use tch::{Kind, Tensor};

use super::{
    PolicyLoss, PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, detached_mean, fraction,
};
use crate::algo::Result;
use crate::algo::agg::{AggOptions, LossAggMode, agg_loss};

pub fn compute(
    inputs: &PolicyLossInputs<'_>,
    cfg: &PolicyLossConfig,
    agg_mode: LossAggMode,
    agg: &AggOptions,
) -> Result<PolicyLoss> {
    inputs.validate()?;
    let mask = inputs.mask()?;
    let (lp, adv) = (inputs.log_prob, inputs.advantages);
    let neg_kl = lp.f_sub(inputs.old_log_prob)?;
    let lengths = mask
        .f_sum_dim_intlist(-1i64, false, None::<Kind>)?
        .f_clamp_min(1.0)?;
    let seq_log_ratio = neg_kl
        .f_mul(&mask)?
        .f_sum_dim_intlist(-1i64, false, None::<Kind>)?
        .f_div(&lengths)?;
    let log_ratio = lp
        .f_sub(&lp.f_detach()?)?
        .f_add(&seq_log_ratio.f_detach()?.f_unsqueeze(-1)?)?
        .f_clamp_max(10.0)?;
    let ratio = log_ratio.f_exp()?;

    let neg_adv = adv.f_neg()?;
    let loss1 = neg_adv.f_mul(&ratio)?;
    let loss2 = neg_adv.f_mul(&ratio.f_clamp(1.0 - cfg.clip_low(), 1.0 + cfg.clip_high())?)?;
    let pg_losses = inputs.weighted(loss1.f_maximum(&loss2)?)?;
    let mode = if cfg.release.gspo_uses_configured_agg() {
        agg_mode
    } else {
        LossAggMode::SeqMeanTokenMean
    };
    let loss = agg_loss(&pg_losses, &mask, mode, agg)?;

    let pg_clipfrac = fraction(&loss2.f_gt_tensor(&loss1)?, &mask)?;
    let ppo_kl = detached_mean(&neg_kl.f_neg()?, &mask)?;
    Ok(PolicyLoss {
        loss,
        metrics: PolicyLossMetrics {
            pg_clipfrac: Some(pg_clipfrac),
            ppo_kl: Some(ppo_kl),
            pg_clipfrac_lower: Some(Tensor::f_zeros([], (mask.f_kind()?, mask.device()))?),
        },
    })
}
