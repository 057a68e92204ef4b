//! `gpg`: group policy gradient (Chu et al. 2025). `α = B / max(1, #{i : s_i ≠ 0})` over the
//! batch of B responses; `A_i = α·(s_i − μ_g)/f_norm` with `f_norm = 1`; a group of one has
//! `μ = 0`.
use tch::Tensor;

use super::{Advantages, GroupIndex, group_mean, outcome};
use crate::algo::Result;

/// `gpg` advantages (= returns).
pub fn compute(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &GroupIndex,
) -> Result<Advantages> {
    outcome(token_level_rewards, response_mask, index, |s, ix| {
        Ok(advantages(s, ix))
    })
}

/// Per-sequence `gpg` advantages from scores.
pub fn advantages(scores: &[f64], index: &GroupIndex) -> Vec<f64> {
    const F_NORM: f64 = 1.0;
    let nonzero = scores.iter().filter(|&&s| s != 0.0).count().max(1);
    let alpha = scores.len() as f64 / nonzero as f64;
    let mut out = vec![0.0; scores.len()];
    for members in index.groups() {
        let mean = if members.len() > 1 {
            group_mean(scores, members)
        } else {
            0.0
        };
        for &i in members {
            out[i] = alpha * (scores[i] - mean) / F_NORM;
        }
    }
    out
}
