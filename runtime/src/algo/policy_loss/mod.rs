//! Policy losses (docs/algorithms.md, `actor.policy_loss.loss_mode`) and the metrics verl logs with
//! them. Every loss takes the current `log_prob` (differentiable), `old_log_prob`,
//! `advantages` and `response_mask` (all `[batch, response_len]`) and optional rollout
//! importance weights `w`, multiplied into the per-token loss (geo_mean: their per-sequence
//! geometric mean) before aggregation.
//!
//! Notation: `Δ = log π_θ − log π_old`, `ρ = exp(clamp(Δ, −20, 20))`, `ε_l`/`ε_h` the clip
//! ratios (fallback `clip_ratio`), `c = clip_ratio_c`.
pub mod cispo;
pub mod clip_cov;
pub mod dppo;
pub mod dro;
pub mod geo_mean;
pub mod gpg;
pub mod gspo;
pub mod kl_cov;
pub mod sapo;
pub mod vanilla;

use tch::Tensor;

use super::agg::{AggOptions, LossAggMode};
use super::masked::masked_mean;
use super::{AlgoError, Result, check};

pub use verlc_spec::algo::{PolicyLossConfig, PolicyLossMode};

/// The tensors of one (micro-)batch.
#[derive(Debug, Clone, Copy)]
pub struct PolicyLossInputs<'a> {
    /// `log π_old` of the rollout-time policy (no gradient).
    pub old_log_prob: &'a Tensor,
    /// `log π_θ` of the policy being trained (carries the gradient).
    pub log_prob: &'a Tensor,
    pub advantages: &'a Tensor,
    pub response_mask: &'a Tensor,
    /// Rollout-correction importance weights `w` (detached), if any.
    pub rollout_is_weights: Option<&'a Tensor>,
}

impl<'a> PolicyLossInputs<'a> {
    pub fn new(
        old_log_prob: &'a Tensor,
        log_prob: &'a Tensor,
        advantages: &'a Tensor,
        response_mask: &'a Tensor,
    ) -> Self {
        PolicyLossInputs {
            old_log_prob,
            log_prob,
            advantages,
            response_mask,
            rollout_is_weights: None,
        }
    }

    pub fn rollout_is_weights(mut self, w: &'a Tensor) -> Self {
        self.rollout_is_weights = Some(w);
        self
    }

    /// Checks shapes, devices and kinds; returns `(batch, response_len)`.
    fn validate(&self) -> Result<(i64, i64)> {
        let mut all = vec![
            (self.log_prob, "log_prob"),
            (self.old_log_prob, "old_log_prob"),
            (self.advantages, "advantages"),
            (self.response_mask, "response_mask"),
        ];
        if let Some(w) = self.rollout_is_weights {
            all.push((w, "rollout_is_weights"));
        }
        let dims = check::same_2d(&all)?;
        check::floating(self.log_prob, "log_prob")?;
        check::floating(self.old_log_prob, "old_log_prob")?;
        check::floating(self.advantages, "advantages")?;
        Ok(dims)
    }

    /// The mask in the kind of `log_prob`.
    fn mask(&self) -> Result<Tensor> {
        Ok(self.response_mask.f_to_kind(self.log_prob.f_kind()?)?)
    }

    /// `loss · w` when rollout weights are given.
    fn weighted(&self, loss: Tensor) -> Result<Tensor> {
        match self.rollout_is_weights {
            Some(w) => Ok(loss.f_mul(w)?),
            None => Ok(loss),
        }
    }
}

/// The scalar metrics a loss reports (0-d, detached); `None` where verl does not log one.
#[derive(Debug, Default)]
pub struct PolicyLossMetrics {
    /// `actor/pg_clipfrac`.
    pub pg_clipfrac: Option<Tensor>,
    /// `actor/ppo_kl`.
    pub ppo_kl: Option<Tensor>,
    /// `actor/pg_clipfrac_lower`.
    pub pg_clipfrac_lower: Option<Tensor>,
}

impl PolicyLossMetrics {
    /// The metrics with verl's names, as numbers (synchronises with the device).
    pub fn named(&self) -> Result<Vec<(&'static str, f64)>> {
        let all = [
            ("actor/pg_clipfrac", &self.pg_clipfrac),
            ("actor/ppo_kl", &self.ppo_kl),
            ("actor/pg_clipfrac_lower", &self.pg_clipfrac_lower),
        ];
        let mut out = Vec::new();
        for (name, value) in all {
            if let Some(t) = value {
                out.push((name, t.f_double_value(&[])?));
            }
        }
        Ok(out)
    }
}

/// A policy loss and its metrics.
#[derive(Debug)]
pub struct PolicyLoss {
    /// The scalar to back-propagate (`actor/pg_loss`).
    pub loss: Tensor,
    pub metrics: PolicyLossMetrics,
}

/// Computes policy loss `mode`. `agg_mode`/`agg` are `actor.loss_agg_mode` and the global-batch
/// information; sapo always aggregates with `seq-mean-token-mean` (gspo too before verl 0.9.1),
/// geo_mean with a plain mean over sequences. The aggregation follows `cfg.release`.
pub fn compute_policy_loss(
    mode: PolicyLossMode,
    inputs: &PolicyLossInputs<'_>,
    cfg: &PolicyLossConfig,
    agg_mode: LossAggMode,
    agg: &AggOptions,
) -> Result<PolicyLoss> {
    let agg = &AggOptions {
        release: cfg.release,
        ..*agg
    };
    match mode {
        PolicyLossMode::Vanilla => vanilla::compute(inputs, cfg, agg_mode, agg),
        PolicyLossMode::Gspo => gspo::compute(inputs, cfg, agg_mode, agg),
        PolicyLossMode::Sapo => sapo::compute(inputs, cfg, agg),
        PolicyLossMode::Gpg => gpg::compute(inputs, agg_mode, agg),
        PolicyLossMode::ClipCov => clip_cov::compute(inputs, cfg, agg_mode, agg),
        PolicyLossMode::KlCov => kl_cov::compute(inputs, cfg, agg_mode, agg),
        PolicyLossMode::GeoMean => geo_mean::compute(inputs, cfg),
        PolicyLossMode::Cispo => cispo::compute(inputs, cfg, agg_mode, agg),
        PolicyLossMode::DppoTv => {
            dppo::compute(inputs, cfg, dppo::Divergence::TotalVariation, agg_mode, agg)
        }
        PolicyLossMode::DppoKl => {
            dppo::compute(inputs, cfg, dppo::Divergence::BinaryKl, agg_mode, agg)
        }
        PolicyLossMode::Dro => dro::compute(inputs, cfg, agg_mode, agg),
    }
}

/// `masked_mean(cond as 0/1)`, detached: the fraction of valid tokens where `cond` holds.
fn fraction(cond: &Tensor, mask: &Tensor) -> Result<Tensor> {
    Ok(masked_mean(&cond.f_to_kind(mask.f_kind()?)?, mask)?.f_detach()?)
}

/// `masked_mean(x)`, detached.
fn detached_mean(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    Ok(masked_mean(&x.f_detach()?, mask)?.f_detach()?)
}

/// `Δ = log π_θ − log π_old`, and the ratio `exp(clamp(Δ, −20, 20))` with the clamped `Δ`.
fn clamped_log_ratio(inputs: &PolicyLossInputs<'_>) -> Result<(Tensor, Tensor)> {
    let neg_kl = inputs
        .log_prob
        .f_sub(inputs.old_log_prob)?
        .f_clamp(-20.0, 20.0)?;
    let ratio = neg_kl.f_exp()?;
    Ok((neg_kl, ratio))
}

fn invalid(msg: impl Into<String>) -> AlgoError {
    AlgoError::Config(msg.into())
}
