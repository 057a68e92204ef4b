//! `opo`: on-policy RL with the optimal baseline (Hao et al. 2025, arXiv:2505.23585). The
//! baseline of a group is the length-weighted mean score `b_g = Σ_j L_j s_j / Σ_j L_j`
//! (`L_j = Σ_t m_{j,t}`); `A_i = s_i − b_g`; a group of one has `b = 0`. A group whose
//! responses are all empty also gets `b = 0` (verl would produce NaN there).
use tch::Tensor;

use super::{Advantages, Batch, GroupIndex};
use crate::algo::Result;

/// `opo` advantages (= returns).
pub fn compute(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &GroupIndex,
) -> Result<Advantages> {
    let batch = Batch::new(token_level_rewards, response_mask, &[])?;
    index.check_len(batch.batch() as i64)?;
    let scores = batch.rewards.row_sums();
    let lengths = batch.mask.row_sums();
    batch.finish_outcome(&advantages(&scores, &lengths, index))
}

/// Per-sequence `opo` advantages from scores and response lengths.
pub fn advantages(scores: &[f64], lengths: &[f64], index: &GroupIndex) -> Vec<f64> {
    let mut out = scores.to_vec();
    for members in index.groups().filter(|m| m.len() > 1) {
        let total_len: f64 = members.iter().map(|&i| lengths[i]).sum();
        let weighted: f64 = members.iter().map(|&i| lengths[i] * scores[i]).sum();
        let baseline = if total_len != 0.0 {
            weighted / total_len
        } else {
            0.0
        };
        for &i in members {
            out[i] = scores[i] - baseline;
        }
    }
    out
}
