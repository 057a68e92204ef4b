//! `kl_cov`: KL-Cov (Cui et al. 2025). `ℓ = −Aρ` with the unclamped `ρ = exp(Δ)`; on the
//! `k = max(1, ⌊N·kl_cov_ratio⌋)` valid tokens with the largest centred covariance
//! `(A − mean A)(log π_θ − mean log π_θ)` (plain means over the N valid tokens; ties go to the
//! earlier token) a KL penalty is added: `ℓ = −Aρ + ppo_kl_coef·|Δ|`. Aggregated with
//! `loss_agg_mode`. Metric: `ppo_kl = mean_m|Δ|`.
use tch::{Kind, Tensor};

use super::{
    PolicyLoss, PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, detached_mean, invalid,
};
use crate::algo::Result;
use crate::algo::advantage::dense::host_vec;
use crate::algo::agg::{AggOptions, LossAggMode, agg_loss};

pub fn compute(
    inputs: &PolicyLossInputs<'_>,
    cfg: &PolicyLossConfig,
    agg_mode: LossAggMode,
    agg: &AggOptions,
) -> Result<PolicyLoss> {
    if cfg.kl_cov_ratio.is_nan() || cfg.kl_cov_ratio <= 0.0 {
        return Err(invalid(format!(
            "kl_cov_ratio should be larger than 0, got {}",
            cfg.kl_cov_ratio
        )));
    }
    inputs.validate()?;
    let mask = inputs.mask()?;
    let (lp, adv) = (inputs.log_prob, inputs.advantages);
    let neg_kl = lp.f_sub(inputs.old_log_prob)?;
    let abs_kl = neg_kl.f_abs()?;
    let loss1 = adv.f_neg()?.f_mul(&neg_kl.f_exp()?)?;
    let loss_kl = loss1.f_add(&abs_kl.f_mul_scalar(cfg.ppo_kl_coef)?)?;

    let selected = {
        let mask_h = host_vec(&mask)?;
        let adv_h = host_vec(adv)?;
        let lp_h = host_vec(&lp.f_detach()?)?;
        let valid: Vec<usize> = (0..mask_h.len()).filter(|&i| mask_h[i] > 0.0).collect();
        let chosen = top_covariance(&valid, &adv_h, &lp_h, cfg.kl_cov_ratio);
        let mut sel = vec![0u8; mask_h.len()];
        for i in chosen {
            sel[i] = 1;
        }
        Tensor::f_from_slice(&sel)?
            .f_view(mask.size().as_slice())?
            .f_to_kind(Kind::Bool)?
            .f_to_device(mask.device())?
    };

    let pg_losses = inputs.weighted(loss_kl.f_where_self(&selected, &loss1)?)?;
    let loss = agg_loss(&pg_losses, &mask, agg_mode, agg)?;
    Ok(PolicyLoss {
        loss,
        metrics: PolicyLossMetrics {
            pg_clipfrac: None,
            ppo_kl: Some(detached_mean(&abs_kl, &mask)?),
            pg_clipfrac_lower: None,
        },
    })
}

/// The `max(1, ⌊N·ratio⌋)` positions among `valid` (flat indices) with the largest centred
/// covariance of advantage and log-prob; none when nothing is valid.
fn top_covariance(valid: &[usize], adv: &[f64], lp: &[f64], ratio: f64) -> Vec<usize> {
    if valid.is_empty() {
        return Vec::new();
    }
    let n = valid.len() as f64;
    let mean_a = valid.iter().map(|&i| adv[i]).sum::<f64>() / n;
    let mean_l = valid.iter().map(|&i| lp[i]).sum::<f64>() / n;
    let cov = |i: usize| (adv[i] - mean_a) * (lp[i] - mean_l);
    let k = ((n * ratio).floor() as usize).max(1);
    let mut order = valid.to_vec();
    // Largest first; `sort_by` is stable, so ties keep batch order.
    order.sort_by(|&a, &b| cov(b).total_cmp(&cov(a)));
    order.truncate(k);
    order
}
