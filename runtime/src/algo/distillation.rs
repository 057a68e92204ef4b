//! verl 0.9's on-policy distillation term (`distillation_loss` in
//! `verl/trainer/distillation/losses.py`, single-sample estimator modes): per response token,
//! `d` is the estimator of the student's log-prob against the teacher's (both of the sampled
//! token: `s − τ`, `|s − τ|`, `½(s − τ)²`, or the clamped `e^{τ−s} − (τ−s) − 1`), clamped to
//! `±loss_max_clamp`; then either aggregated as the actor's loss (supervised), or used as a
//! reward: a vanilla PPO-clip term with advantages `−d` (detached), the distillation clip
//! ratios and dual-clip 3. The caller adds it to the task's PPO loss.
use tch::{Kind, Tensor};

use super::agg::{AggOptions, LossAggMode, agg_loss};
use super::kl::kl_value;
use super::masked::masked_mean;
use super::policy_loss::{PolicyLossConfig, PolicyLossInputs, vanilla};
use super::{AlgoError, Result, item};

pub use verlc_spec::trainer::DistillationLossSpec;

/// The dual-clip bound of the policy-gradient form (verl's default: the distillation loss
/// config has no `clip_ratio_c`).
const CLIP_RATIO_C: f64 = 3.0;

/// The term and its metrics (`actor/distillation/*`: `abs_loss`, `loss_min` and `loss_max`
/// before the clamp, and the policy-gradient form's `pg_clipfrac`, `ppo_kl`,
/// `pg_clipfrac_lower`).
#[derive(Debug)]
pub struct DistillationTerm {
    pub loss: Tensor,
    pub metrics: Vec<(String, f64)>,
}

/// The inputs of one micro-batch, all `(rows, response_len)`.
#[derive(Debug, Clone, Copy)]
pub struct DistillationInputs<'a> {
    /// The student's log-probs (with the gradient).
    pub log_prob: &'a Tensor,
    /// The teacher's log-probs of the same tokens.
    pub teacher_log_prob: &'a Tensor,
    /// The rollout-time student's (the policy-gradient form's ratio).
    pub old_log_prob: &'a Tensor,
    pub response_mask: &'a Tensor,
    pub rollout_is_weights: Option<&'a Tensor>,
}

pub fn distillation_term(
    spec: &DistillationLossSpec,
    inputs: &DistillationInputs<'_>,
    agg_mode: LossAggMode,
    agg: &AggOptions,
) -> Result<DistillationTerm> {
    let mask = inputs.response_mask;
    let d = kl_value(spec.estimator, inputs.log_prob, inputs.teacher_log_prob)?;
    let mut metrics = Vec::new();
    let detached = d.f_detach()?;
    metrics.push((
        "actor/distillation/abs_loss".to_owned(),
        item(&masked_mean(&detached.f_abs()?, mask)?)?,
    ));
    let valid = mask.f_to_kind(Kind::Bool)?;
    if valid.f_any()?.f_int64_value(&[])? != 0 {
        let picked = detached.f_masked_select(&valid)?;
        metrics.push((
            "actor/distillation/loss_min".to_owned(),
            item(&picked.f_min()?)?,
        ));
        metrics.push((
            "actor/distillation/loss_max".to_owned(),
            item(&picked.f_max()?)?,
        ));
    }
    let d = match spec.loss_max_clamp {
        Some(c) if c.is_nan() || c < 0.0 => {
            return Err(AlgoError::Unsupported(format!(
                "distillation loss_max_clamp must be non-negative, got {c}"
            )));
        }
        // Both sides: k1 can be negative.
        Some(c) => d.f_clamp(-c, c)?,
        None => d,
    };
    let loss = if spec.use_policy_gradient {
        let advantages = d.f_detach()?.f_neg()?;
        let mut pg = PolicyLossInputs::new(inputs.old_log_prob, inputs.log_prob, &advantages, mask);
        if let Some(w) = inputs.rollout_is_weights {
            pg = pg.rollout_is_weights(w);
        }
        let cfg = PolicyLossConfig {
            clip_ratio: spec.clip_ratio_low,
            clip_ratio_low: Some(spec.clip_ratio_low),
            clip_ratio_high: Some(spec.clip_ratio_high),
            clip_ratio_c: CLIP_RATIO_C,
            ..PolicyLossConfig::default()
        };
        let out = vanilla::compute(&pg, &cfg, agg_mode, agg)?;
        for (name, v) in out.metrics.named()? {
            let leaf = name.trim_start_matches("actor/");
            metrics.push((format!("actor/distillation/{leaf}"), v));
        }
        out.loss
    } else {
        agg_loss(&d, mask, agg_mode, agg)?
    };
    Ok(DistillationTerm { loss, metrics })
}
