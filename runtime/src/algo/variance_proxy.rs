//! verl 0.9's `variance_proxy/*` metrics (`compute_variance_proxy_metrics`): how noisy the
//! policy gradient of a batch is, from the score-norm proxy
//! `W(τ) = Σ_t (1 − 2π_t + Σ_v π_v²)` (times `ρ_t²` with rollout importance weights) and
//! each trajectory's mean advantage `Ā(τ)`. Logged whenever the old-log-prob pass computed
//! `Σ_v π_v²`, whatever the estimator.
//!
//! - `proxy1_signal_strength`: the squared gradient norm of the update (`actor/grad_norm`²);
//! - `proxy2_total_power`: `mean(Ā² W)` (with weights: `mean(ρ̄² Ā² W₀)`, `ρ̄` the trajectory's
//!   mean weight and `W₀` the unweighted proxy), W clamped at 0;
//! - `proxy3_pure_noise`: `max(0, (proxy2 − proxy1) / (N − 1))`;
//! - `expected_a_squared`: `mean(Ā²)`; `expected_w`: `mean(W)`.

use tch::Tensor;

use super::Result;
use super::advantage::dense::host_vec;

/// `masked_mean` / `masked_sum`'s ε (verl's torch_functional).
const MEAN_EPS: f64 = 1e-8;

/// The `[batch, response_len]` inputs.
#[derive(Debug, Clone, Copy)]
pub struct VarianceInputs<'a> {
    pub old_log_probs: &'a Tensor,
    pub sum_pi_squared: &'a Tensor,
    pub advantages: &'a Tensor,
    pub response_mask: &'a Tensor,
    pub rollout_is_weights: Option<&'a Tensor>,
}

/// The metrics, by verl name.
pub fn variance_proxy_metrics(
    x: &VarianceInputs<'_>,
    grad_norm: Option<f64>,
) -> Result<Vec<(&'static str, f64)>> {
    let cols = x.advantages.size().last().copied().unwrap_or(0).max(1) as usize;
    let old = host_vec(x.old_log_probs)?;
    let sq = host_vec(x.sum_pi_squared)?;
    let adv = host_vec(x.advantages)?;
    let mask = host_vec(x.response_mask)?;
    let is = x.rollout_is_weights.map(host_vec).transpose()?;
    let rows = adv.len() / cols;
    let (mut a_bar, mut w_sum, mut w_orig, mut is_bar) = (vec![], vec![], vec![], vec![]);
    for i in 0..rows {
        let (mut a, mut m, mut w, mut w0, mut rho) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for t in i * cols..(i + 1) * cols {
            let base = 1.0 - 2.0 * old[t].exp() + sq[t];
            let scaled = match &is {
                Some(is) => base * is[t].powi(2),
                None => base,
            };
            a += adv[t] * mask[t];
            m += mask[t];
            w += scaled * mask[t];
            if let Some(is) = &is {
                // verl divides the weighted proxy by the clamped squared weight again.
                w0 += scaled / is[t].powi(2).max(1e-10) * mask[t];
                rho += is[t] * mask[t];
            }
        }
        a_bar.push(a / (m + MEAN_EPS));
        w_sum.push(w);
        w_orig.push(w0.max(0.0));
        is_bar.push(rho / (m + MEAN_EPS));
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let power: Vec<f64> = if is.is_some() {
        (0..rows)
            .map(|i| is_bar[i].powi(2) * a_bar[i].powi(2) * w_orig[i])
            .collect()
    } else {
        (0..rows)
            .map(|i| a_bar[i].powi(2) * w_sum[i].max(0.0))
            .collect()
    };
    let proxy2 = mean(&power);
    let proxy1 = grad_norm.map(|g| g * g);
    let proxy3 = match proxy1 {
        Some(p1) if rows > 1 => (proxy2 - p1) / (rows as f64 - 1.0),
        _ => 0.0,
    }
    .max(0.0);
    let a2: Vec<f64> = a_bar.iter().map(|a| a * a).collect();
    Ok(vec![
        (
            "variance_proxy/proxy1_signal_strength",
            proxy1.unwrap_or(0.0),
        ),
        ("variance_proxy/proxy2_total_power", proxy2),
        ("variance_proxy/proxy3_pure_noise", proxy3),
        ("variance_proxy/expected_a_squared", mean(&a2)),
        ("variance_proxy/expected_w", mean(&w_sum)),
    ])
}
