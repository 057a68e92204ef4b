//! `gdpo` (verl 0.9; Group reward-Decoupled normalization Policy Optimization): each reward
//! component `k` (a key of the reward function's result dict) is normalised within its group
//! as GRPO does, `A_k = (r_k − μ_g)/(σ_g + ε)`, the components are summed with weights `w_k`
//! (equal when unset), and the sum is whitened over the batch's response tokens:
//! `A = whiten(Σ_k w_k A_k) · m`. Returns equal advantages. Without components the token-level
//! rewards' row sums are the one component.
use tch::Tensor;

use super::dense::{self, host_vec};
use super::{Advantages, Batch, GroupIndex, grpo};
use crate::algo::{AlgoError, Result};

/// The reward components: one `[batch]` tensor per key, with optional weights.
#[derive(Debug, Clone, Copy)]
pub struct Components<'a> {
    pub scores: &'a [Tensor],
    pub weights: Option<&'a [f64]>,
}

pub fn compute(
    rewards: &Tensor,
    mask: &Tensor,
    index: &GroupIndex,
    components: Option<Components<'_>>,
    norm_by_std: bool,
    epsilon: f64,
) -> Result<Advantages> {
    let batch = Batch::new(rewards, mask, &[])?;
    let n = batch.batch();
    index.check_len(n as i64)?;
    let score_lists: Vec<Vec<f64>> = match components {
        Some(c) => c
            .scores
            .iter()
            .map(|t| {
                let v = host_vec(t)?;
                if v.len() != n {
                    return Err(AlgoError::Data(format!(
                        "a GDPO reward component has {} values for {n} responses",
                        v.len()
                    )));
                }
                Ok(v)
            })
            .collect::<Result<_>>()?,
        None => vec![batch.rewards.row_sums()],
    };
    let weights: Vec<f64> = match components.and_then(|c| c.weights) {
        Some(w) if w.len() != score_lists.len() => {
            return Err(AlgoError::Data(format!(
                "{} GDPO reward weights for {} reward keys",
                w.len(),
                score_lists.len()
            )));
        }
        Some(w) => w.to_vec(),
        None => vec![1.0; score_lists.len()],
    };
    let mut sum = vec![0.0; n];
    for (scores, w) in score_lists.iter().zip(&weights) {
        for (s, a) in sum
            .iter_mut()
            .zip(grpo::advantages(scores, index, norm_by_std, epsilon))
        {
            *s += w * a;
        }
    }
    let token = dense::broadcast(&sum, &batch.mask);
    let white = dense::masked_whiten(&token, &batch.mask)?;
    let adv = white.zip(&batch.mask, |a, m| a * m);
    batch.finish(&adv, &adv)
}
