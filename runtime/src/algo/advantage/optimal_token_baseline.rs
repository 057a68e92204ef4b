//! Optimal token baseline (verl 0.9's `optimal_token_baseline` and its multi-turn form
//! `tir_optimal_token_baseline`): a baseline per timestep and prompt group, weighted by each
//! trajectory's accumulated path variance.
//!
//! With `w_t = (1 − 2π_t + Σ_v π_v²) · ρ_t²` (π_t the old policy's probability of the sampled
//! token, ρ_t the rollout importance weight when rollout correction gives one) and
//! `W_t = Σ_{j≤t} w_j` over the response tokens, the baseline of a group at step `t` is
//! `B_t = Σ_i G_{i,t} W_{i,t} / (Σ_i W_{i,t} + ε)` (`G` the reward-to-go), and `A = G − B`.
//! A group of one keeps `A = G`. When one trajectory is strictly the longest of its group, its
//! baseline past the second-longest length is 0 (verl's `handle_zero_tail`, on by default).
//!
//! The single-turn form indexes steps by response position; the multi-turn form by the
//! trajectory's own token count (the response mask may have holes: tool turns), skipping empty
//! responses when it forms groups.

use tch::Tensor;

use super::dense::Rows;
use super::{Advantages, Batch, GroupIndex};
use crate::algo::Result;

/// verl's default ε of the denominator.
pub const EPSILON: f64 = 1e-8;

/// The per-token inputs besides rewards and mask, `[batch, response_len]`.
#[derive(Debug, Clone, Copy)]
pub struct PathInputs<'a> {
    pub old_log_probs: &'a Tensor,
    pub sum_pi_squared: &'a Tensor,
    pub rollout_is_weights: Option<&'a Tensor>,
}

/// `optimal_token_baseline`: steps are response positions.
pub fn compute(
    rewards: &Tensor,
    mask: &Tensor,
    index: &GroupIndex,
    path: &PathInputs<'_>,
) -> Result<Advantages> {
    run(rewards, mask, index, path, false)
}

/// `tir_optimal_token_baseline`: steps are the trajectory's own tokens.
pub fn compute_multi_turn(
    rewards: &Tensor,
    mask: &Tensor,
    index: &GroupIndex,
    path: &PathInputs<'_>,
) -> Result<Advantages> {
    run(rewards, mask, index, path, true)
}

fn run(
    rewards: &Tensor,
    mask: &Tensor,
    index: &GroupIndex,
    path: &PathInputs<'_>,
    multi_turn: bool,
) -> Result<Advantages> {
    let mut extra = vec![
        (path.old_log_probs, "old_log_probs"),
        (path.sum_pi_squared, "sum_pi_squared"),
    ];
    if let Some(w) = path.rollout_is_weights {
        extra.push((w, "rollout_is_weights"));
    }
    let batch = Batch::new(rewards, mask, &extra)?;
    index.check_len(batch.batch() as i64)?;
    let (n, len) = (batch.batch(), batch.rewards.len);
    let m = &batch.mask;
    let old = batch.rows(path.old_log_probs)?;
    let sq = batch.rows(path.sum_pi_squared)?;
    let is = path.rollout_is_weights.map(|w| batch.rows(w)).transpose()?;

    // Reward-to-go G and cumulative path variance W, per row, over the masked tokens; in the
    // multi-turn form compacted to the row's own tokens (`steps[i]` positions each).
    let mut g = Rows::zeros(n, len);
    let mut w = Rows::zeros(n, len);
    for i in 0..n {
        let mut acc = 0.0;
        for t in (0..len).rev() {
            acc += batch.rewards.get(i, t) * m.get(i, t);
            g.set(i, t, acc);
        }
        let mut cum = 0.0;
        for t in 0..len {
            let mut wt = 1.0 - 2.0 * old.get(i, t).exp() + sq.get(i, t);
            if let Some(is) = &is {
                wt *= is.get(i, t).powi(2);
            }
            cum += wt * m.get(i, t);
            w.set(i, t, cum);
        }
    }
    let steps: Vec<usize> = (0..n)
        .map(|i| (0..len).filter(|&t| m.get(i, t) != 0.0).count())
        .collect();
    // The steps of row i: its positions (single-turn), or its masked positions in order.
    let positions: Vec<Vec<usize>> = (0..n)
        .map(|i| {
            if multi_turn {
                (0..len).filter(|&t| m.get(i, t) != 0.0).collect()
            } else {
                (0..len).collect()
            }
        })
        .collect();
    // A step's weight: masked in the single-turn form (padding counts zero), every compacted
    // step in the multi-turn form.
    let weight = |i: usize, k: usize| {
        let t = positions[i][k];
        if multi_turn {
            w.get(i, t)
        } else {
            w.get(i, t) * m.get(i, t)
        }
    };
    let ret = |i: usize, k: usize| {
        let t = positions[i][k];
        if multi_turn {
            g.get(i, t)
        } else {
            g.get(i, t) * m.get(i, t)
        }
    };

    let mut adv = Rows::zeros(n, len);
    for members in index.groups() {
        let members: Vec<usize> = if multi_turn {
            members.iter().copied().filter(|&i| steps[i] > 0).collect()
        } else {
            members.to_vec()
        };
        let width = members
            .iter()
            .map(|&i| positions[i].len())
            .max()
            .unwrap_or(0);
        let mut baseline = vec![0.0; width];
        if members.len() > 1 {
            for (k, b) in baseline.iter_mut().enumerate() {
                let (mut num, mut den) = (0.0, 0.0);
                for &i in &members {
                    if k < positions[i].len() {
                        num += ret(i, k) * weight(i, k);
                        den += weight(i, k);
                    }
                }
                *b = num / (den + EPSILON);
            }
        }
        // The strictly longest trajectory gets no baseline past the second-longest length.
        let tail = if members.len() > 1 {
            let mut lengths: Vec<usize> = members.iter().map(|&i| steps[i]).collect();
            lengths.sort_unstable();
            let (longest, second) = (lengths[lengths.len() - 1], lengths[lengths.len() - 2]);
            let holders: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&i| steps[i] == longest)
                .collect();
            (holders.len() == 1 && longest > second).then(|| (holders[0], second))
        } else {
            None
        };
        for &i in &members {
            for (k, &t) in positions[i].iter().enumerate() {
                let b = match tail {
                    Some((row, from)) if row == i && k >= from => 0.0,
                    _ => baseline[k],
                };
                adv.set(i, t, (g.get(i, t) - b) * m.get(i, t));
            }
        }
    }
    // Rows left out of every group (empty multi-turn responses) have a zero mask: A = 0.
    let returns = g;
    batch.finish(&adv, &returns)
}
