//! `grpo` and `grpo_vectorized`: the outcome score normalised within its group (GRPO, Shao et
//! al. 2024; without the std it is Dr. GRPO, Liu et al. 2025).
//!
//! `A_i = (s_i − μ_g)/(σ_g + ε)` if `norm_adv_by_std_in_grpo`, else `s_i − μ_g`; a group of one
//! response has `μ = 0, σ = 1`.
//! - `grpo`: `σ_g` is the unbiased std (`torch.std`).
//! - `grpo_vectorized`: verl 0.8 on, `σ_g = sqrt(Σ(x − μ)²/max(K−1, 1))` (two-pass, no floor);
//!   before 0.8, `σ_g = sqrt(max((Σx² − (Σx)²/K)/max(K−1, 1), ε))` (one-pass, floored at ε).
//!
//! verl's `compute_advantage` does not pass `norm_adv_by_std_in_grpo` to `grpo_vectorized`
//! (it always divides by the std there); verlc honours the flag for both, which agrees with verl
//! for the default `true`, and `verlc check` warns (V051) where they differ.
use tch::Tensor;

use super::{Advantages, GroupIndex, group_mean, group_std, outcome};
use crate::algo::Result;
use verlc_spec::algo::AlgoRelease;

/// `grpo` advantages (= returns).
pub fn compute(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &GroupIndex,
    norm_by_std: bool,
    epsilon: f64,
) -> Result<Advantages> {
    outcome(token_level_rewards, response_mask, index, |s, ix| {
        Ok(advantages(s, ix, norm_by_std, epsilon))
    })
}

/// `grpo_vectorized` advantages (= returns), as `release` computes them.
pub fn compute_vectorized(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &GroupIndex,
    norm_by_std: bool,
    epsilon: f64,
    release: AlgoRelease,
) -> Result<Advantages> {
    outcome(token_level_rewards, response_mask, index, |s, ix| {
        Ok(advantages_vectorized(s, ix, norm_by_std, epsilon, release))
    })
}

/// Per-sequence `grpo` advantages from scores.
pub fn advantages(scores: &[f64], index: &GroupIndex, norm_by_std: bool, epsilon: f64) -> Vec<f64> {
    let mut out = vec![0.0; scores.len()];
    for members in index.groups() {
        let (mean, std) = match members.len() {
            1 => (0.0, 1.0),
            _ => (group_mean(scores, members), group_std(scores, members)),
        };
        for &i in members {
            out[i] = if norm_by_std {
                (scores[i] - mean) / (std + epsilon)
            } else {
                scores[i] - mean
            };
        }
    }
    out
}

/// Per-sequence `grpo_vectorized` advantages from scores.
pub fn advantages_vectorized(
    scores: &[f64],
    index: &GroupIndex,
    norm_by_std: bool,
    epsilon: f64,
    release: AlgoRelease,
) -> Vec<f64> {
    let mut out = vec![0.0; scores.len()];
    for members in index.groups() {
        let k = members.len() as f64;
        let (mean, std) = if members.len() <= 1 {
            (0.0, 1.0)
        } else if release.grpo_vectorized_two_pass() {
            let mean = members.iter().map(|&i| scores[i]).sum::<f64>() / k;
            let ss: f64 = members.iter().map(|&i| (scores[i] - mean).powi(2)).sum();
            (mean, (ss / (k - 1.0).max(1.0)).max(0.0).sqrt())
        } else {
            let s1: f64 = members.iter().map(|&i| scores[i]).sum();
            let s2: f64 = members.iter().map(|&i| scores[i] * scores[i]).sum();
            let var = (s2 - s1 * s1 / k) / (k - 1.0).max(1.0);
            (s1 / k, var.max(epsilon).sqrt())
        };
        for &i in members {
            out[i] = if norm_by_std {
                (scores[i] - mean) / (std + epsilon)
            } else {
                scores[i] - mean
            };
        }
    }
    out
}
