//! `gae`: generalized advantage estimation (Schulman et al. 2016) with verl's handling of
//! masked tokens.
//!
//! Backwards over t: `δ_t = r_t + γ·V_next − V_t`, `Â_t = δ_t + γλ·Â_next`. At a masked token
//! (`m = 0`: padding, or observation/tool tokens inside a multi-turn response) `V_next` and
//! `Â_next` are carried through unchanged, so the TD chain skips it. Returns are `Â + V`; the
//! advantages are `Â` whitened over the mask. Masked positions are not zeroed (as in verl).
use tch::Tensor;

use super::dense::{Rows, masked_whiten};
use super::{Advantages, Batch};
use crate::algo::Result;

/// GAE advantages and returns.
pub fn compute(
    token_level_rewards: &Tensor,
    values: &Tensor,
    response_mask: &Tensor,
    gamma: f64,
    lam: f64,
) -> Result<Advantages> {
    let batch = Batch::new(token_level_rewards, response_mask, &[(values, "values")])?;
    let values = batch.rows(values)?;
    let raw = gae_rows(&batch.rewards, &values, &batch.mask, gamma, lam);
    let returns = raw.zip(&values, |a, v| a + v);
    let advantages = masked_whiten(&raw, &batch.mask)?;
    batch.finish(&advantages, &returns)
}

/// The un-whitened `Â` of every position.
pub(crate) fn gae_rows(rewards: &Rows, values: &Rows, mask: &Rows, gamma: f64, lam: f64) -> Rows {
    let mut out = Rows::zeros(rewards.batch, rewards.len);
    for i in 0..rewards.batch {
        let (mut next_value, mut last_gae) = (0.0, 0.0);
        for t in (0..rewards.len).rev() {
            let (r, v, m) = (rewards.get(i, t), values.get(i, t), mask.get(i, t));
            let delta = r + gamma * next_value - v;
            let gae = delta + gamma * lam * last_gae;
            next_value = v * m + (1.0 - m) * next_value;
            last_gae = gae * m + (1.0 - m) * last_gae;
            out.set(i, t, last_gae);
        }
    }
    out
}
