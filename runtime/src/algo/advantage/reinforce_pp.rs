//! `reinforce_plus_plus` and `reinforce_plus_plus_baseline` (REINFORCE++, Hu 2025,
//! arXiv:2501.03262).
//!
//! - `reinforce_plus_plus`: backwards over t. verl 0.9 on: `g = r_t + γ·R`, `G_t = g·m_t`,
//!   `R = g·m_t + R·(1 − m_t)` (the running return carries across masked positions, such as a
//!   tool's tokens, and the returns are masked); before 0.9: `G_t = r_t + γ·R`, `R = G_t·m_t`
//!   (it restarts after a masked token). Advantages are `whiten(G)·m` over the batch, returns
//!   are `G`.
//! - `reinforce_plus_plus_baseline`: `a_i = s_i − μ_g` (group of one: `μ = 0`), broadcast over
//!   the tokens, then `whiten(a·m)·m` over the whole batch; returns = advantages.
use tch::Tensor;

use super::dense::{Rows, broadcast, masked_whiten};
use super::{Advantages, Batch, GroupIndex, group_mean};
use crate::algo::Result;
use verlc_spec::algo::AlgoRelease;

/// `reinforce_plus_plus` advantages and returns, as `release` computes them.
pub fn compute(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    gamma: f64,
    release: AlgoRelease,
) -> Result<Advantages> {
    let batch = Batch::new(token_level_rewards, response_mask, &[])?;
    let returns = if release.reinforce_pp_carries_over_masks() {
        carried_returns(&batch.rewards, &batch.mask, gamma)
    } else {
        discounted_returns(&batch.rewards, &batch.mask, gamma)
    };
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

/// `G_{i,t}` of verl 0.9: the running return carried across masked positions, the returns
/// masked.
fn carried_returns(rewards: &Rows, mask: &Rows, gamma: f64) -> Rows {
    let mut out = Rows::zeros(rewards.batch, rewards.len);
    for i in 0..rewards.batch {
        let mut running = 0.0;
        for t in (0..rewards.len).rev() {
            let m = mask.get(i, t);
            let g = rewards.get(i, t) + gamma * running;
            out.set(i, t, g * m);
            running = g * m + running * (1.0 - m);
        }
    }
    out
}

/// `G_{i,t}` before verl 0.9: the running return restarts after masked tokens.
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
