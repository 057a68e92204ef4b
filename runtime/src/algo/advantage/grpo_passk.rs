//! `grpo_passk`: pass@k training (Chen et al. 2025, arXiv:2503.19595). Per group only the best
//! response `i* = argmax s` gets an advantage, `s_max − s_second` (divided by `σ_g + ε`, the
//! unbiased group std, if `norm_adv_by_std_in_grpo`); the others get 0. Every group needs at
//! least two responses. With ties at the maximum the advantage is 0 whichever is picked.
use tch::Tensor;

use super::{Advantages, GroupIndex, group_std, outcome};
use crate::algo::{AlgoError, Result};

/// `grpo_passk` advantages (= returns).
pub fn compute(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &GroupIndex,
    norm_by_std: bool,
    epsilon: f64,
) -> Result<Advantages> {
    outcome(token_level_rewards, response_mask, index, |s, ix| {
        advantages(s, ix, norm_by_std, epsilon)
    })
}

/// Per-sequence `grpo_passk` advantages from scores.
pub fn advantages(
    scores: &[f64],
    index: &GroupIndex,
    norm_by_std: bool,
    epsilon: f64,
) -> Result<Vec<f64>> {
    let mut out = vec![0.0; scores.len()];
    for members in index.groups() {
        if members.len() < 2 {
            return Err(AlgoError::Data(format!(
                "Pass@k requires at least 2 samples per group. Got {} for the group of sample {}.",
                members.len(),
                members[0]
            )));
        }
        // Best first; among equal scores the earlier sample.
        let mut order = members.to_vec();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let (best, second) = (order[0], order[1]);
        let gap = scores[best] - scores[second];
        out[best] = if norm_by_std {
            gap / (group_std(scores, members) + epsilon)
        } else {
            gap
        };
    }
    Ok(out)
}
