//! `reinforce_plus_plus` and `reinforce_plus_plus_baseline` (REINFORCE++, Hu 2025,
//! arXiv:2501.03262).
//!
//! - `reinforce_plus_plus`: backwards over t, `G_t = r_t + γ·G_{t+1}`, and after each step the
//!   running return is multiplied by `m_t` (so it resets at padding after EOS and at masked
//!   tokens); advantages are `whiten(G)·m` over the batch, returns are `G`.
//! - `reinforce_plus_plus_baseline`: `a_i = s_i − μ_g` (group of one: `μ = 0`), broadcast over
//!   the tokens, then `whiten(a·m)·m` over the whole batch; returns = advantages.
use tch::Tensor;

use super::dense::{Rows, broadcast, masked_whiten};
use super::{Advantages, Batch, GroupIndex, group_mean};
use crate::algo::Result;

/// `reinforce_plus_plus` advantages and returns.
pub fn compute(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    gamma: f64,
) -> Result<Advantages> {
    let batch = Batch::new(token_level_rewards, response_mask, &[])?;
    let returns = discounted_returns(&batch.rewards, &batch.mask, gamma);
    let advantages = masked_whiten(&returns, &batch.mask)?.zip(&batch.mask, |a, m| a * m);
    batch.finish(&advantages, &returns)
}

/// `reinforce_plus_plus_baseline` advantages (= returns).
pub fn compute_baseline(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &GroupIndex,
) -> Result<Advantages> {
    let batch = Batch::new(token_level_rewards, response_mask, &[])?;
    index.check_len(batch.batch() as i64)?;
    let scores = batch.rewards.row_sums();
    let centred = group_centred(&scores, index);
    let tiled = broadcast(&centred, &batch.mask);
    let advantages = masked_whiten(&tiled, &batch.mask)?.zip(&batch.mask, |a, m| a * m);
    batch.finish(&advantages, &advantages)
}

/// `G_{i,t}` with the reset after masked tokens.
fn discounted_returns(rewards: &Rows, mask: &Rows, gamma: f64) -> Rows {
    let mut out = Rows::zeros(rewards.batch, rewards.len);
    for i in 0..rewards.batch {
        let mut running = 0.0;
        for t in (0..rewards.len).rev() {
            running = rewards.get(i, t) + gamma * running;
            out.set(i, t, running);
            running *= mask.get(i, t);
        }
    }
    out
}

/// `s_i − μ_g`, with `μ = 0` for a group of one.
fn group_centred(scores: &[f64], index: &GroupIndex) -> Vec<f64> {
    let mut out = scores.to_vec();
    for members in index.groups().filter(|m| m.len() > 1) {
        let mean = group_mean(scores, members);
        for &i in members {
            out[i] = scores[i] - mean;
        }
    }
    out
}
