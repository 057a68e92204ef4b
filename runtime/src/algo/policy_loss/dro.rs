//! `dro`: direct reward optimisation's policy loss (verl 0.9+): a policy gradient with a
//! quadratic penalty on the log-ratio, `ℓ = −(A·log π_θ − ½·β·Δ²)`, `β = dro_beta` (positive;
//! `verlc check` refuses it otherwise, V054). Metric: `ppo_kl = mean_m(−Δ)` (Δ unclamped).
use super::{
    PolicyLoss, PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, detached_mean, invalid,
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
    let beta = match cfg.dro_beta {
        Some(b) if b > 0.0 => b,
        other => {
            return Err(invalid(format!(
                "policy_loss.dro_beta must be positive for the dro loss, got {other:?}"
            )));
        }
    };
    let mask = inputs.mask()?;
    let log_ratio = inputs.log_prob.f_sub(inputs.old_log_prob)?;
    let pg_losses = inputs
        .log_prob
        .f_mul(inputs.advantages)?
        .f_sub(&log_ratio.f_square()?.f_mul_scalar(0.5 * beta)?)?
        .f_neg()?;
    let loss = agg_loss(&inputs.weighted(pg_losses)?, &mask, agg_mode, agg)?;
    Ok(PolicyLoss {
        loss,
        metrics: PolicyLossMetrics {
            ppo_kl: Some(detached_mean(&log_ratio.f_neg()?, &mask)?),
            ..PolicyLossMetrics::default()
        },
    })
}
