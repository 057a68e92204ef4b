//! verl 0.9's on-policy distillation term (`distillation_loss` in
//! `verl/trainer/distillation/losses.py`): per response token, `d` is either the estimator of
//! the student's log-prob against the teacher's (both of the sampled token: `s − τ`,
//! `|s − τ|`, `½(s − τ)²`, or the clamped `e^{τ−s} − (τ−s) − 1`), or the top-k forward KL the
//! student's forward computed against the teacher's top-k ([`super::topk_kl`], clamped at 0);
//! clamped to `±loss_max_clamp`; then either aggregated as the actor's loss (supervised), or
//! used as a reward: a vanilla PPO-clip term with advantages `−d` (detached), the distillation
//! clip ratios and dual-clip 3. The caller adds it to the task's PPO loss.
use tch::{Kind, Tensor};

use super::agg::{AggOptions, LossAggMode, agg_loss};
use super::kl::kl_value;
use super::masked::masked_mean;
use super::policy_loss::{PolicyLossConfig, PolicyLossInputs, vanilla};
use super::topk_kl::TopKKl;
use super::{AlgoError, Result, item};

pub use verlc_spec::trainer::{DistillationLossSpec, DistillationMode};

/// The dual-clip bound of the policy-gradient form (verl's default: the distillation loss
/// config has no `clip_ratio_c`).
const CLIP_RATIO_C: f64 = 3.0;

/// The term and its metrics (`actor/distillation/*`: the estimators' `abs_loss`, the top-k
/// loss's masses and overlap, `loss_min` and `loss_max` before the clamp, and the
/// policy-gradient form's `pg_clipfrac`, `ppo_kl`, `pg_clipfrac_lower`).
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
    /// What the teacher contributes for the loss mode.
    pub teacher: Teacher<'a>,
    /// The rollout-time student's (the policy-gradient form's ratio).
    pub old_log_prob: &'a Tensor,
    pub response_mask: &'a Tensor,
    pub rollout_is_weights: Option<&'a Tensor>,
}

/// The teacher's side of the loss.
#[derive(Debug, Clone, Copy)]
pub enum Teacher<'a> {
    /// The teacher's log-probs of the sampled tokens (the estimator modes).
    LogProb(&'a Tensor),
    /// The top-k forward KL the student's forward computed against the teacher's top-k.
    TopK(&'a TopKKl),
}

pub fn distillation_term(
    spec: &DistillationLossSpec,
    inputs: &DistillationInputs<'_>,
    agg_mode: LossAggMode,
    agg: &AggOptions,
) -> Result<DistillationTerm> {
    let mask = inputs.response_mask;
    let mut metrics = Vec::new();
    let d = match (spec.mode, inputs.teacher) {
        (DistillationMode::Estimator(kind), Teacher::LogProb(teacher)) => {
            let d = kl_value(kind, inputs.log_prob, teacher)?;
            // k1 can be negative: verl logs the mean absolute loss.
            metrics.push((
                "actor/distillation/abs_loss".to_owned(),
                item(&masked_mean(&d.f_detach()?.f_abs()?, mask)?)?,
            ));
            d
        }
        (DistillationMode::ForwardKlTopk { topk, .. }, Teacher::TopK(kl)) => {
            metrics.extend(topk_metrics(kl, mask, topk)?);
            // The top-k lists do not sum to one, so the divergence can dip below zero.
            kl.loss.f_clamp_min(0.0)?
        }
        _ => {
            return Err(AlgoError::Unsupported(
                "the distillation loss mode and the teacher's outputs do not match".into(),
            ));
        }
    };
    let detached = d.f_detach()?;
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

/// verl's top-k metrics over the response tokens: the student's and the teacher's mass of
/// the teacher's top-k (mean, min, max), the share of the teacher's top-k the student's
/// top-k holds, and the mean overlap advantage where there is overlap (0 where none).
fn topk_metrics(kl: &TopKKl, mask: &Tensor, k: i64) -> Result<Vec<(String, f64)>> {
    let valid = mask.f_to_kind(Kind::Bool)?;
    if valid.f_any()?.f_int64_value(&[])? == 0 {
        return Ok(Vec::new());
    }
    let name = |leaf: &str| format!("actor/distillation/{leaf}");
    let mut out = Vec::new();
    for (leaf, mass) in [
        ("student_mass", &kl.student_mass),
        ("teacher_mass", &kl.teacher_mass),
    ] {
        let picked = mass.f_masked_select(&valid)?;
        out.push((name(leaf), item(&picked.f_mean(Kind::Double)?)?));
        out.push((name(&format!("{leaf}_min")), item(&picked.f_min()?)?));
        out.push((name(&format!("{leaf}_max")), item(&picked.f_max()?)?));
    }
    let counts = kl.overlap_count.f_masked_select(&valid)?;
    out.push((
        name("overlap_ratio"),
        item(&counts.f_mean(Kind::Double)?)? / k as f64,
    ));
    let overlapping = valid.f_logical_and(&kl.overlap_count.f_gt(0.0)?)?;
    let advantage = if overlapping.f_any()?.f_int64_value(&[])? != 0 {
        item(
            &kl.overlap_advantage
                .f_masked_select(&overlapping)?
                .f_mean(Kind::Double)?,
        )?
    } else {
        0.0
    };
    out.push((name("overlap_token_advantage"), advantage));
    Ok(out)
}
