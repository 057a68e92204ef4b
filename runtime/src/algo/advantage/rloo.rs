//! `rloo` and `rloo_vectorized`: REINFORCE leave-one-out (Ahmadian et al. 2024).
//!
//! - `rloo`: a group of K > 1 gives `A_i = K/(K−1)·(s_i − μ_g) = s_i − mean_{j≠i} s_j`; a group
//!   of one gives `A_i = s_i`.
//! - `rloo_vectorized`: `A_i = (K·s_i − Σ_g s)/max(K−1, 1)·[K > 1]`, the same for K > 1 but 0
//!   for a group of one.
use tch::Tensor;

use super::{Advantages, GroupIndex, group_mean, outcome};
use crate::algo::Result;

/// `rloo` advantages (= returns).
pub fn compute(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &GroupIndex,
) -> Result<Advantages> {
    outcome(token_level_rewards, response_mask, index, |s, ix| {
        Ok(advantages(s, ix))
    })
}

/// `rloo_vectorized` advantages (= returns).
pub fn compute_vectorized(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &GroupIndex,
) -> Result<Advantages> {
    outcome(token_level_rewards, response_mask, index, |s, ix| {
        Ok(advantages_vectorized(s, ix))
    })
}

/// Per-sequence `rloo` advantages from scores.
pub fn advantages(scores: &[f64], index: &GroupIndex) -> Vec<f64> {
    let mut out = scores.to_vec();
    for members in index.groups().filter(|m| m.len() > 1) {
        let k = members.len() as f64;
        let mean = group_mean(scores, members);
        for &i in members {
            out[i] = scores[i] * k / (k - 1.0) - mean * k / (k - 1.0);
        }
    }
    out
}

/// Per-sequence `rloo_vectorized` advantages from scores.
pub fn advantages_vectorized(scores: &[f64], index: &GroupIndex) -> Vec<f64> {
    let mut out = vec![0.0; scores.len()];
    for members in index.groups().filter(|m| m.len() > 1) {
        let k = members.len() as f64;
        let sum: f64 = members.iter().map(|&i| scores[i]).sum();
        for &i in members {
            out[i] = (k * scores[i] - sum) / (k - 1.0);
        }
    }
    out
}
