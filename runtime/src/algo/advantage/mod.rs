//! Advantage estimators (docs/algorithms.md, `algorithm.adv_estimator`). Every estimator takes
//! `token_level_rewards` and `response_mask` (`[batch, response_len]`) and returns advantages
//! and returns of the same shape, kind and device as the rewards. Outcome estimators use the
//! per-sequence score `s_i = Σ_t r_{i,t}` and broadcast a scalar per sequence over its valid
//! tokens (`A_{i,t} = A_i · m_{i,t}`); group-based ones take a [`GroupIndex`] (verl's `uid`).
//!
//! Estimation runs without autograd, in f64 on the host ([`dense`]), then is cast back.
pub(crate) mod dense;
pub mod gae;
pub mod gdpo;
pub mod gpg;
mod group;
pub mod grpo;
pub mod grpo_passk;
pub mod opo;
pub mod optimal_token_baseline;
pub mod reinforce_pp;
pub mod remax;
pub mod rloo;

use tch::{Device, Kind, Tensor};

pub use group::GroupIndex;

use self::dense::Rows;
use super::{AlgoError, Result, check};

pub use verlc_spec::algo::{AdvEstimator, AdvantageConfig};

/// The batch data an estimator may read.
#[derive(Debug, Clone, Copy)]
pub struct AdvantageInputs<'a> {
    /// `[batch, response_len]` token-level rewards (scores minus any in-reward KL penalty).
    pub token_level_rewards: &'a Tensor,
    /// `[batch, response_len]`, 1 for tokens the policy generated.
    pub response_mask: &'a Tensor,
    /// `[batch, response_len]` critic values (gae).
    pub values: Option<&'a Tensor>,
    /// Group of each sample (the group-based estimators).
    pub index: Option<&'a GroupIndex>,
    /// `[batch]` summed reward of the greedy rollout of each prompt (remax).
    pub reward_baselines: Option<&'a Tensor>,
    /// `[batch, response_len]` old-policy log-probs and `Σ_v π_v²`, and the rollout
    /// importance weights when rollout correction computed them (the optimal token baselines).
    pub old_log_probs: Option<&'a Tensor>,
    pub sum_pi_squared: Option<&'a Tensor>,
    pub rollout_is_weights: Option<&'a Tensor>,
    /// GDPO's reward components (the keys of the reward function's dict, one `[batch]` tensor
    /// each) and their weights.
    pub components: Option<gdpo::Components<'a>>,
}

impl<'a> AdvantageInputs<'a> {
    pub fn new(token_level_rewards: &'a Tensor, response_mask: &'a Tensor) -> Self {
        AdvantageInputs {
            token_level_rewards,
            response_mask,
            values: None,
            index: None,
            reward_baselines: None,
            old_log_probs: None,
            sum_pi_squared: None,
            rollout_is_weights: None,
            components: None,
        }
    }

    pub fn components(mut self, components: gdpo::Components<'a>) -> Self {
        self.components = Some(components);
        self
    }

    /// The old policy's log-probs and `Σ_v π_v²`.
    pub fn path_variance(mut self, old_log_probs: &'a Tensor, sum_pi_squared: &'a Tensor) -> Self {
        self.old_log_probs = Some(old_log_probs);
        self.sum_pi_squared = Some(sum_pi_squared);
        self
    }

    pub fn rollout_is_weights(mut self, weights: &'a Tensor) -> Self {
        self.rollout_is_weights = Some(weights);
        self
    }

    pub fn values(mut self, values: &'a Tensor) -> Self {
        self.values = Some(values);
        self
    }

    pub fn index(mut self, index: &'a GroupIndex) -> Self {
        self.index = Some(index);
        self
    }

    pub fn reward_baselines(mut self, reward_baselines: &'a Tensor) -> Self {
        self.reward_baselines = Some(reward_baselines);
        self
    }
}

/// Advantages and returns, `[batch, response_len]`.
#[derive(Debug)]
pub struct Advantages {
    pub advantages: Tensor,
    pub returns: Tensor,
}

/// Runs estimator `est` (verl's `compute_advantage`).
pub fn compute_advantage(
    est: AdvEstimator,
    inputs: &AdvantageInputs<'_>,
    cfg: &AdvantageConfig,
) -> Result<Advantages> {
    let what = est.as_str();
    let index = || {
        inputs.index.ok_or(AlgoError::MissingInput {
            what,
            input: "index (group ids)",
        })
    };
    let (r, m) = (inputs.token_level_rewards, inputs.response_mask);
    let eps = cfg.epsilon;
    let norm = cfg.norm_adv_by_std_in_grpo;
    match est {
        AdvEstimator::Gae => {
            let values = inputs.values.ok_or(AlgoError::MissingInput {
                what,
                input: "values",
            })?;
            gae::compute(r, values, m, cfg.gamma, cfg.lam)
        }
        AdvEstimator::Grpo => grpo::compute(r, m, index()?, norm, eps),
        AdvEstimator::GrpoVectorized => {
            grpo::compute_vectorized(r, m, index()?, norm, eps, cfg.release)
        }
        AdvEstimator::GrpoPassk => grpo_passk::compute(r, m, index()?, norm, eps),
        AdvEstimator::ReinforcePlusPlus => reinforce_pp::compute(r, m, cfg.gamma, cfg.release),
        AdvEstimator::ReinforcePlusPlusBaseline => reinforce_pp::compute_baseline(r, m, index()?),
        AdvEstimator::Rloo => rloo::compute(r, m, index()?),
        AdvEstimator::RlooVectorized => rloo::compute_vectorized(r, m, index()?),
        AdvEstimator::Opo => opo::compute(r, m, index()?),
        AdvEstimator::Remax => {
            let baselines = inputs.reward_baselines.ok_or(AlgoError::MissingInput {
                what,
                input: "reward_baselines",
            })?;
            remax::compute(r, baselines, m)
        }
        AdvEstimator::Gpg => gpg::compute(r, m, index()?),
        AdvEstimator::Gdpo => gdpo::compute(r, m, index()?, inputs.components, norm, eps),
        AdvEstimator::OptimalTokenBaseline | AdvEstimator::TirOptimalTokenBaseline => {
            let missing = |input| AlgoError::MissingInput { what, input };
            let path = optimal_token_baseline::PathInputs {
                old_log_probs: inputs.old_log_probs.ok_or(missing("old_log_probs"))?,
                sum_pi_squared: inputs.sum_pi_squared.ok_or(missing("sum_pi_squared"))?,
                rollout_is_weights: inputs.rollout_is_weights,
            };
            if est == AdvEstimator::OptimalTokenBaseline {
                optimal_token_baseline::compute(r, m, index()?, &path)
            } else {
                optimal_token_baseline::compute_multi_turn(r, m, index()?, &path)
            }
        }
    }
}

/// Rewards and mask copied to the host, with what is needed to build the outputs.
pub(crate) struct Batch {
    pub rewards: Rows,
    pub mask: Rows,
    kind: Kind,
    device: Device,
}

impl Batch {
    /// Validates `[batch, response_len]` rewards and mask (plus `extra` tensors of the same
    /// shape) and copies them to the host.
    pub fn new(
        rewards: &Tensor,
        mask: &Tensor,
        extra: &[(&Tensor, &'static str)],
    ) -> Result<Batch> {
        let mut all = vec![(rewards, "token_level_rewards"), (mask, "response_mask")];
        all.extend_from_slice(extra);
        let (b, l) = check::same_2d(&all)?;
        let kind = if rewards.is_floating_point() {
            rewards.f_kind()?
        } else {
            Kind::Float
        };
        Ok(Batch {
            rewards: Rows::from_tensor(rewards, b, l)?,
            mask: Rows::from_tensor(mask, b, l)?,
            kind,
            device: rewards.device(),
        })
    }

    pub fn batch(&self) -> usize {
        self.rewards.batch
    }

    /// Host rows of another `[batch, response_len]` input.
    pub fn rows(&self, t: &Tensor) -> Result<Rows> {
        Rows::from_tensor(t, self.rewards.batch as i64, self.rewards.len as i64)
    }

    /// The outputs, in the rewards' kind and device.
    pub fn finish(&self, advantages: &Rows, returns: &Rows) -> Result<Advantages> {
        Ok(Advantages {
            advantages: advantages.to_tensor(self.kind, self.device)?,
            returns: returns.to_tensor(self.kind, self.device)?,
        })
    }

    /// Outputs of an outcome estimator: advantages = returns = `a_i · m_{i,t}`.
    pub fn finish_outcome(&self, per_sequence: &[f64]) -> Result<Advantages> {
        let adv = dense::broadcast(per_sequence, &self.mask);
        self.finish(&adv, &adv)
    }
}

/// The common shape of the group-based outcome estimators: scores `s_i = Σ_t r_{i,t}`, one
/// advantage per sequence from `f(scores, index)`, broadcast over the mask.
pub(crate) fn outcome(
    rewards: &Tensor,
    mask: &Tensor,
    index: &GroupIndex,
    f: impl FnOnce(&[f64], &GroupIndex) -> Result<Vec<f64>>,
) -> Result<Advantages> {
    let batch = Batch::new(rewards, mask, &[])?;
    index.check_len(batch.batch() as i64)?;
    let scores = batch.rewards.row_sums();
    let per_sequence = f(&scores, index)?;
    batch.finish_outcome(&per_sequence)
}

/// Mean of the scores of `members`.
pub(crate) fn group_mean(scores: &[f64], members: &[usize]) -> f64 {
    members.iter().map(|&i| scores[i]).sum::<f64>() / members.len() as f64
}

/// Unbiased (Bessel) standard deviation of the scores of `members` (`torch.std`); needs two.
pub(crate) fn group_std(scores: &[f64], members: &[usize]) -> f64 {
    let mean = group_mean(scores, members);
    let ss: f64 = members.iter().map(|&i| (scores[i] - mean).powi(2)).sum();
    (ss / (members.len() as f64 - 1.0)).sqrt()
}
