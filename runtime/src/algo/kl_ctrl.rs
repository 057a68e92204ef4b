//! The in-reward KL penalty (`algorithm.use_kl_in_reward`) and its coefficient controllers
//! (`algorithm.kl_ctrl`), docs/algorithms.md:
//!
//! `KL_{i,t} = kl_penalty(old_log_probs, ref_log_prob)·m`; `r_{i,t} = score_{i,t} − β·KL_{i,t}`;
//! `current_kl = mean_i(masked_mean_t KL)`; then the controller updates β: fixed keeps
//! `kl_coef`; adaptive (Ziegler et al. 2019) sets `e = clip(current_kl/target_kl − 1, −0.2, 0.2)`
//! and `β ← β·(1 + e·n/horizon)` with `n` the batch size.
use tch::Tensor;

use super::kl::{KlEstimator, kl_penalty};
use super::masked::masked_mean_dim;
use super::{AlgoError, Result, check};

/// The controller of the in-reward KL coefficient β.
#[derive(Debug, Clone, PartialEq)]
pub enum KlController {
    /// β stays at `kl_coef`.
    Fixed { value: f64 },
    /// β follows the measured KL towards `target`.
    Adaptive {
        value: f64,
        target: f64,
        horizon: f64,
    },
}

impl KlController {
    /// verl's `FixedKLController(kl_coef)`.
    pub fn fixed(kl_coef: f64) -> Self {
        KlController::Fixed { value: kl_coef }
    }

    /// verl's `AdaptiveKLController(kl_coef, target_kl, horizon)`; `horizon` must be positive.
    pub fn adaptive(kl_coef: f64, target_kl: f64, horizon: f64) -> Result<Self> {
        if horizon.is_nan() || horizon <= 0.0 {
            return Err(AlgoError::Config(format!(
                "horizon must be larger than 0. Got {horizon}"
            )));
        }
        if target_kl == 0.0 {
            return Err(AlgoError::Config(
                "the adaptive KL controller needs a non-zero target_kl".into(),
            ));
        }
        Ok(KlController::Adaptive {
            value: kl_coef,
            target: target_kl,
            horizon,
        })
    }

    /// The current coefficient β.
    pub fn value(&self) -> f64 {
        match *self {
            KlController::Fixed { value } | KlController::Adaptive { value, .. } => value,
        }
    }

    /// Updates β after a batch of `n_steps` samples whose mean KL was `current_kl`.
    pub fn update(&mut self, current_kl: f64, n_steps: usize) {
        if let KlController::Adaptive {
            value,
            target,
            horizon,
        } = self
        {
            let error = (current_kl / *target - 1.0).clamp(-0.2, 0.2);
            *value *= 1.0 + error * n_steps as f64 / *horizon;
        }
    }
}

/// Result of [`apply_kl_penalty`].
#[derive(Debug)]
pub struct KlPenalty {
    /// `token_level_scores − β·KL·m`.
    pub token_level_rewards: Tensor,
    /// `actor/reward_kl_penalty`: the batch mean of the per-sequence masked-mean KL.
    pub reward_kl_penalty: f64,
    /// `actor/reward_kl_penalty_coeff`: β used for this batch (before the update).
    pub reward_kl_penalty_coeff: f64,
}

impl KlPenalty {
    /// The metrics with verl's names.
    pub fn metrics(&self) -> [(&'static str, f64); 2] {
        [
            ("actor/reward_kl_penalty", self.reward_kl_penalty),
            (
                "actor/reward_kl_penalty_coeff",
                self.reward_kl_penalty_coeff,
            ),
        ]
    }
}

/// Subtracts the KL penalty from the token-level scores and updates `ctrl` (verl's
/// `apply_kl_penalty`). All tensors are `[batch, response_len]`.
pub fn apply_kl_penalty(
    token_level_scores: &Tensor,
    old_log_probs: &Tensor,
    ref_log_prob: &Tensor,
    response_mask: &Tensor,
    est: KlEstimator,
    ctrl: &mut KlController,
) -> Result<KlPenalty> {
    let (batch, _) = check::same_2d(&[
        (token_level_scores, "token_level_scores"),
        (old_log_probs, "old_log_probs"),
        (ref_log_prob, "ref_log_prob"),
        (response_mask, "response_mask"),
    ])?;
    let kind = check::floating(token_level_scores, "token_level_scores")?;
    let _guard = tch::no_grad_guard();
    let kld =
        kl_penalty(old_log_probs, ref_log_prob, est)?.f_mul(&response_mask.f_to_kind(kind)?)?;
    let beta = ctrl.value();
    let token_level_rewards = token_level_scores.f_sub(&kld.f_mul_scalar(beta)?)?;
    let current_kl = if batch == 0 {
        0.0
    } else {
        masked_mean_dim(&kld, response_mask, -1)?
            .f_mean(tch::Kind::Double)?
            .f_double_value(&[])?
    };
    ctrl.update(current_kl, batch as usize);
    Ok(KlPenalty {
        token_level_rewards,
        reward_kl_penalty: current_kl,
        reward_kl_penalty_coeff: beta,
    })
}
