//! `remax`: ReMax (Li et al. 2023). Returns `G_t = Σ_{t'≥t} r_{t'}·m_{t'}`; advantages
//! `A_t = G_t − b_i·m_t`, where `b_i` (`reward_baselines`) is the summed reward of a greedy
//! rollout of the same prompt.
use tch::Tensor;

use super::dense::Rows;
use super::{Advantages, Batch};
use crate::algo::{Result, check};

/// `remax` advantages and returns; `reward_baselines` is `[batch]`.
pub fn compute(
    token_level_rewards: &Tensor,
    reward_baselines: &Tensor,
    response_mask: &Tensor,
) -> Result<Advantages> {
    let batch = Batch::new(token_level_rewards, response_mask, &[])?;
    check::shape(
        reward_baselines,
        "reward_baselines",
        &[batch.batch() as i64],
    )?;
    let baselines = super::dense::host_vec(reward_baselines)?;
    let (rewards, mask) = (&batch.rewards, &batch.mask);
    let mut returns = Rows::zeros(rewards.batch, rewards.len);
    let mut advantages = Rows::zeros(rewards.batch, rewards.len);
    for (i, &baseline) in baselines.iter().enumerate() {
        let mut running = 0.0;
        for t in (0..rewards.len).rev() {
            running += rewards.get(i, t) * mask.get(i, t);
            returns.set(i, t, running);
            advantages.set(i, t, running - baseline * mask.get(i, t));
        }
    }
    batch.finish(&advantages, &returns)
}
