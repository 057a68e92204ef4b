//! `sapo`: soft adaptive policy optimisation (arXiv:2511.20347). A smooth gate replaces the hard
//! clip: `τ = tau_pos` if `A > 0` else `tau_neg`, `f(ρ) = σ(τ(ρ − 1))·4/τ`, `ℓ = −f(ρ)·A`
//! (ρ from the clamped Δ); always aggregated with `seq-mean-token-mean`. Metrics:
//! `pg_clipfrac = 0`, `ppo_kl = mean_m(−Δ)`, `pg_clipfrac_lower = 0`.
use tch::Tensor;

use super::{
    PolicyLoss, PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, clamped_log_ratio,
    detached_mean, invalid,
};
use crate::algo::Result;
use crate::algo::agg::{AggOptions, LossAggMode, agg_loss};

pub fn compute(
    inputs: &PolicyLossInputs<'_>,
    cfg: &PolicyLossConfig,
    agg: &AggOptions,
) -> Result<PolicyLoss> {
    if cfg.tau_pos == 0.0 || cfg.tau_neg == 0.0 {
        return Err(invalid(format!(
            "SAPO needs non-zero tau_pos and tau_neg, got {} and {}",
            cfg.tau_pos, cfg.tau_neg
        )));
    }
    inputs.validate()?;
    let mask = inputs.mask()?;
    let adv = inputs.advantages;
    let (neg_kl, ratio) = clamped_log_ratio(inputs)?;
    let kind = ratio.f_kind()?;
    let positive = adv.f_gt(0.0)?;
    let tau = Tensor::f_full_like(&ratio, cfg.tau_pos)?
        .f_where_self(&positive, &Tensor::f_full_like(&ratio, cfg.tau_neg)?)?;
    // σ(τ(ρ − 1)) · 4/τ
    let gate = tau
        .f_mul(&ratio.f_sub_scalar(1.0)?)?
        .f_sigmoid()?
        .f_mul_scalar(4.0)?
        .f_div(&tau)?;
    let pg_losses = inputs.weighted(gate.f_mul(adv)?.f_neg()?)?;
    let loss = agg_loss(&pg_losses, &mask, LossAggMode::SeqMeanTokenMean, agg)?;
    let zero = || Tensor::f_zeros([], (kind, mask.device()));
    Ok(PolicyLoss {
        loss,
        metrics: PolicyLossMetrics {
            pg_clipfrac: Some(zero()?),
            ppo_kl: Some(detached_mean(&neg_kl.f_neg()?, &mask)?),
            pg_clipfrac_lower: Some(zero()?),
        },
    })
}
