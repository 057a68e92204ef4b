//! `geo_mean`: geometric-mean policy optimisation (GMPO, Zhao et al. 2025, arXiv:2507.20673).
//!
//! `δ = Δ` (unclamped), `δ_c = clamp(δ, −ε_l, ε_h)`, `δ* = sgn(A)·min(sgn(A)δ, sgn(A)δ_c)` (the
//! pessimistic side of the clip, per token); per sequence `ρ_i = exp(Σ_t mδ* / (Σ_t m + 1e-8))`
//! (the geometric mean of the token ratios), `Â_i = Σ_t mA / (Σ_t m + 1e-8)`, `ℓ_i = −Â_iρ_i`,
//! times the geometric mean `exp(Σ_t m log(w + 1e-10)/(Σ_t m + 1e-8))` of the rollout weights if
//! given. The loss is the plain mean of `ℓ_i` over the sequences (`loss_agg_mode` and the
//! global-batch information are not used). Metrics, with `clipped = δ ≠ δ_c`:
//! `pg_clipfrac = mean_m[clipped ∧ A > 0]`, `pg_clipfrac_lower = mean_m[clipped ∧ A < 0]`,
//! `ppo_kl = mean_m(−δ)`.
use tch::Kind;

use super::{
    PolicyLoss, PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, detached_mean, fraction,
};
use crate::algo::Result;
use crate::algo::masked::{MEAN_EPS, masked_sum_dim};

pub fn compute(inputs: &PolicyLossInputs<'_>, cfg: &PolicyLossConfig) -> Result<PolicyLoss> {
    inputs.validate()?;
    let mask = inputs.mask()?;
    let adv = inputs.advantages;
    let delta = inputs.log_prob.f_sub(inputs.old_log_prob)?;
    let delta_c = delta.f_clamp(-cfg.clip_low(), cfg.clip_high())?;
    let sign = adv.f_sign()?;
    let pessimistic = sign.f_mul(&sign.f_mul(&delta)?.f_minimum(&sign.f_mul(&delta_c)?)?)?;

    let lengths = mask
        .f_sum_dim_intlist(-1i64, false, None::<Kind>)?
        .f_add_scalar(MEAN_EPS)?;
    let ratio = masked_sum_dim(&pessimistic, &mask, -1)?
        .f_div(&lengths)?
        .f_exp()?;
    let seq_adv = masked_sum_dim(adv, &mask, -1)?.f_div(&lengths)?;
    let mut pg_losses = seq_adv.f_neg()?.f_mul(&ratio)?;
    if let Some(w) = inputs.rollout_is_weights {
        let log_w = w.f_add_scalar(1e-10)?.f_log()?;
        pg_losses = pg_losses.f_mul(
            &masked_sum_dim(&log_w, &mask, -1)?
                .f_div(&lengths)?
                .f_exp()?,
        )?;
    }
    let loss = pg_losses.f_mean(None::<Kind>)?;

    let clipped = delta.f_ne_tensor(&delta_c)?;
    let pg_clipfrac = fraction(&clipped.f_logical_and(&adv.f_gt(0.0)?)?, &mask)?;
    let pg_clipfrac_lower = fraction(&clipped.f_logical_and(&adv.f_lt(0.0)?)?, &mask)?;
    Ok(PolicyLoss {
        loss,
        metrics: PolicyLossMetrics {
            pg_clipfrac: Some(pg_clipfrac),
            ppo_kl: Some(detached_mean(&delta.f_neg()?, &mask)?),
            pg_clipfrac_lower: Some(pg_clipfrac_lower),
        },
    })
}
