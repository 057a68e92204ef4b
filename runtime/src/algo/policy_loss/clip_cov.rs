//! `clip_cov`: Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs").
//!
//! `ℓ1 = −Aρ`, `ℓ2 = −A·clip(ρ, 1−ε_l, 1+ε_h)` with the unclamped ratio `ρ = exp(Δ)` and no dual
//! clip. The centred covariance `cov = (A − mean_m A)·(log π_θ − mean_m sg(log π_θ))` marks
//! tokens that drive entropy collapse: among valid tokens not already clipped (`ℓ2 > ℓ1`) with
//! `clip_cov_lb < cov < clip_cov_ub`, `max(1, ⌊clip_cov_ratio·Σm⌋)` are drawn uniformly at
//! random (libtorch's `randperm` on the global CPU generator, so `tch::manual_seed` makes it
//! reproducible) and their loss (hence gradient) is zeroed: `ℓ = max(ℓ1, ℓ2)·corr`.
//! Metrics: `pg_clipfrac = mean_m[corr = 0]`, `ppo_kl = mean_m(−Δ)`.
use tch::{Device, Kind, Tensor};

use super::{
    PolicyLoss, PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, detached_mean, fraction,
    invalid,
};
use crate::algo::Result;
use crate::algo::advantage::dense::host_vec;
use crate::algo::agg::{AggOptions, LossAggMode, agg_loss};
use crate::algo::masked::masked_mean;

pub fn compute(
    inputs: &PolicyLossInputs<'_>,
    cfg: &PolicyLossConfig,
    agg_mode: LossAggMode,
    agg: &AggOptions,
) -> Result<PolicyLoss> {
    if cfg.clip_cov_ratio.is_nan() || cfg.clip_cov_ratio <= 0.0 {
        return Err(invalid(format!(
            "clip_cov_ratio should be larger than 0, got {}",
            cfg.clip_cov_ratio
        )));
    }
    inputs.validate()?;
    let mask = inputs.mask()?;
    let (lp, adv) = (inputs.log_prob, inputs.advantages);
    let neg_kl = lp.f_sub(inputs.old_log_prob)?;
    let ratio = neg_kl.f_exp()?;
    let neg_adv = adv.f_neg()?;
    let loss1 = neg_adv.f_mul(&ratio)?;
    let loss2 = neg_adv.f_mul(&ratio.f_clamp(1.0 - cfg.clip_low(), 1.0 + cfg.clip_high())?)?;

    let corr = {
        let _guard = tch::no_grad_guard();
        let valid = mask.f_gt(0.0)?;
        let unclipped = loss2.f_gt_tensor(&loss1)?.f_logical_not()?;
        let lp = lp.f_detach()?;
        let cov = adv
            .f_sub(&masked_mean(adv, &mask)?)?
            .f_mul(&lp.f_sub(&masked_mean(&lp, &mask)?)?)?;
        let in_band = cov
            .f_gt(cfg.clip_cov_lb)?
            .f_logical_and(&cov.f_lt(cfg.clip_cov_ub)?)?;
        let eligible_mask = valid.f_logical_and(&unclipped)?.f_logical_and(&in_band)?;
        let eligible: Vec<usize> = host_vec(&eligible_mask)?
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != 0.0)
            .map(|(i, _)| i)
            .collect();
        let valid_tokens: f64 = host_vec(&mask)?.iter().sum();
        let clip_num = ((cfg.clip_cov_ratio * valid_tokens).floor() as usize).max(1);
        let chosen = pick_random(&eligible, clip_num)?;
        let mut corr = vec![1.0f64; mask.numel()];
        for i in chosen {
            corr[i] = 0.0;
        }
        Tensor::f_from_slice(&corr)?
            .f_view(mask.size().as_slice())?
            .f_to_kind(mask.f_kind()?)?
            .f_to_device(mask.device())?
    };

    let pg_clipfrac = fraction(&corr.f_eq(0.0)?, &mask)?;
    let pg_losses = inputs.weighted(loss1.f_maximum(&loss2)?.f_mul(&corr)?)?;
    let loss = agg_loss(&pg_losses, &mask, agg_mode, agg)?;
    Ok(PolicyLoss {
        loss,
        metrics: PolicyLossMetrics {
            pg_clipfrac: Some(pg_clipfrac),
            ppo_kl: Some(detached_mean(&neg_kl.f_neg()?, &mask)?),
            pg_clipfrac_lower: None,
        },
    })
}

/// `min(n, candidates.len())` of `candidates`, uniformly at random without replacement.
fn pick_random(candidates: &[usize], n: usize) -> Result<Vec<usize>> {
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let perm = Tensor::f_randperm(candidates.len() as i64, (Kind::Int64, Device::Cpu))?;
    let perm = Vec::<i64>::try_from(&perm)?;
    Ok(perm
        .iter()
        .take(n)
        .map(|&j| candidates[j as usize])
        .collect())
}
