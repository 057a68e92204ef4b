//! `cispo`: clipped importance-sampling policy optimisation (MiniMax-M1, arXiv:2506.13585):
//! `ℓ = −sg(clip(ρ, 1−ε_l, 1+ε_h))·A·log π_θ` — the clipped ratio only weights a REINFORCE
//! term, so every token keeps a gradient. Metrics: `pg_clipfrac = mean_m[ρ ≠ clip(ρ)]`,
//! `ppo_kl = mean_m(−Δ)`, `pg_clipfrac_lower = 0`.
use tch::Tensor;

use super::{
    PolicyLoss, PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, clamped_log_ratio,
    detached_mean, fraction,
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
    let (neg_kl, ratio) = clamped_log_ratio(inputs)?;
    let clipped = ratio.f_clamp(1.0 - cfg.clip_low(), 1.0 + cfg.clip_high())?;
    let pg_losses = clipped
        .f_detach()?
        .f_mul(inputs.advantages)?
        .f_mul(inputs.log_prob)?
        .f_neg()?;
    let loss = agg_loss(&inputs.weighted(pg_losses)?, &mask, agg_mode, agg)?;
    Ok(PolicyLoss {
        loss,
        metrics: PolicyLossMetrics {
            pg_clipfrac: Some(fraction(&ratio.f_ne_tensor(&clipped)?, &mask)?),
            ppo_kl: Some(detached_mean(&neg_kl.f_neg()?, &mask)?),
            pg_clipfrac_lower: Some(Tensor::f_zeros([], (mask.f_kind()?, mask.device()))?),
        },
    })
}
