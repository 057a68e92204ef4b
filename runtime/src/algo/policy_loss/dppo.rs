//! `dppo_tv` and `dppo_kl`: decoupled PPO with a binary trust region (DPPO, arXiv:2602.04879;
//! verl 0.8+). Instead of clipping the ratio, a token keeps its gradient only while the new
//! probability `p = π_θ(a)` stays inside a trust region around `p_old`, measured on the
//! binary distribution {a, not a}; the step itself is a REINFORCE term weighted by the
//! truncated, detached ratio:
//! `ℓ = −A · sg(min(ρ, c)) · log π_θ · v`, with `c = clip_ratio_c` and the validity mask `v`:
//! - `dppo_tv`: `A > 0`: `p − p_old ≤ ε_h`; else `p − p_old ≥ −ε_l` (total variation);
//! - `dppo_kl`: `A > 0`: `KL_bin(p_old ‖ p) ≤ ε_h` or `p ≤ p_old`; else `KL_bin ≤ ε_l` or
//!   `p ≥ p_old`, where `KL_bin = p_old·(log p_old − log p) + (1 − p_old)·log((1 − p_old + 1e−8)
//!   / (1 − p + 1e−8))`.
//!
//! Here `ε_l`/`ε_h` are divergence thresholds, not ratio bounds. Metrics:
//! `pg_clipfrac = mean_m(1 − v)`, `ppo_kl = mean_m(−Δ)`, `pg_clipfrac_lower =
//! mean_m([ρ > c]·v)`.
use tch::Tensor;

use super::{
    PolicyLoss, PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, clamped_log_ratio,
    detached_mean,
};
use crate::algo::Result;
use crate::algo::agg::{AggOptions, LossAggMode, agg_loss};
use crate::algo::masked::masked_mean;

/// The trust region a token's move is measured in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Divergence {
    TotalVariation,
    BinaryKl,
}

pub fn compute(
    inputs: &PolicyLossInputs<'_>,
    cfg: &PolicyLossConfig,
    divergence: Divergence,
    agg_mode: LossAggMode,
    agg: &AggOptions,
) -> Result<PolicyLoss> {
    inputs.validate()?;
    let mask = inputs.mask()?;
    let (neg_kl, ratio) = clamped_log_ratio(inputs)?;
    let c = cfg.clip_ratio_c;
    let truncated = ratio.f_clamp_max(c)?.f_detach()?;
    let valid = valid_mask(inputs, cfg, divergence)?;
    let pg_losses = inputs
        .advantages
        .f_mul(&truncated)?
        .f_mul(inputs.log_prob)?
        .f_mul(&valid)?
        .f_neg()?;
    let loss = agg_loss(&inputs.weighted(pg_losses)?, &mask, agg_mode, agg)?;
    let invalid = valid.f_neg()?.f_add_scalar(1.0)?;
    let truncated_valid = ratio.f_gt(c)?.f_to_kind(valid.f_kind()?)?.f_mul(&valid)?;
    Ok(PolicyLoss {
        loss,
        metrics: PolicyLossMetrics {
            pg_clipfrac: Some(masked_mean(&invalid, &mask)?.f_detach()?),
            ppo_kl: Some(detached_mean(&neg_kl.f_neg()?, &mask)?),
            pg_clipfrac_lower: Some(masked_mean(&truncated_valid, &mask)?.f_detach()?),
        },
    })
}

/// `v` (detached, in the log-probs' kind): 1 where the token's move stays in the trust region
/// on the side its advantage pushes it, else 0.
fn valid_mask(
    inputs: &PolicyLossInputs<'_>,
    cfg: &PolicyLossConfig,
    divergence: Divergence,
) -> Result<Tensor> {
    let lp = inputs.log_prob.f_detach()?;
    let old = inputs.old_log_prob;
    let (p, p_old) = (lp.f_exp()?, old.f_exp()?);
    let (up, down) = match divergence {
        Divergence::TotalVariation => {
            let moved = p.f_sub(&p_old)?;
            (moved.f_le(cfg.clip_high())?, moved.f_ge(-cfg.clip_low())?)
        }
        Divergence::BinaryKl => {
            let eps = 1e-8;
            let rest = p_old
                .f_neg()?
                .f_add_scalar(1.0 + eps)?
                .f_div(&p.f_neg()?.f_add_scalar(1.0 + eps)?)?
                .f_log()?;
            let kl = p_old
                .f_mul(&old.f_sub(&lp)?)?
                .f_add(&p_old.f_neg()?.f_add_scalar(1.0)?.f_mul(&rest)?)?;
            (
                kl.f_le(cfg.clip_high())?
                    .f_logical_or(&p.f_le_tensor(&p_old)?)?,
                kl.f_le(cfg.clip_low())?
                    .f_logical_or(&p.f_ge_tensor(&p_old)?)?,
            )
        }
    };
    let positive = inputs.advantages.f_gt(0.0)?;
    Ok(up.f_where_self(&positive, &down)?.f_to_kind(lp.f_kind()?)?)
}
