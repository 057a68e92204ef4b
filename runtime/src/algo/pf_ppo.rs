//! PF-PPO (policy-filtered PPO, `algorithm.use_pf_ppo`): after the advantages, the batch is
//! resampled with replacement, as many rows as it has, by a weight of each response's summed
//! score (verl 0.7.0's `compute_pf_ppo_reweight_data`, which runs in its GAE branch only):
//! - `pow`: `|score| ^ weight_pow`;
//! - `max_min`: 1 for the highest and the lowest score, 0 otherwise;
//! - `max_random`: 0.4 for the highest score, 0.1 otherwise;
//!
//! then `max(w + 1e-8, 1e-8)`, so every row keeps a chance. verl draws with
//! `torch.multinomial` from torch's global generator; verlc draws the same distribution from
//! the trainer's seeded stream (inverse CDF over the weights), identically on every rank.

use tch::{Kind, Tensor};
use verlc_spec::trainer::PfPpoMethod;

use crate::rng::Rng;

use super::AlgoError;

/// The resampling weight of each row, `scores` (N) being the rows' summed token scores.
pub fn pf_ppo_weights(
    scores: &Tensor,
    method: PfPpoMethod,
    weight_pow: f64,
) -> Result<Tensor, AlgoError> {
    let s = scores.f_to_kind(Kind::Float)?;
    let w = match method {
        PfPpoMethod::Pow => s.f_abs()?.f_pow_tensor_scalar(weight_pow)?,
        PfPpoMethod::MaxMin => {
            let hit = s
                .f_eq_tensor(&s.f_max()?)?
                .f_logical_or(&s.f_eq_tensor(&s.f_min()?)?)?;
            hit.f_to_kind(Kind::Float)?
        }
        PfPpoMethod::MaxRandom => {
            let top = s.f_eq_tensor(&s.f_max()?)?.f_to_kind(Kind::Float)?;
            top.f_mul_scalar(0.3)?.f_add_scalar(0.1)?
        }
    };
    Ok(w.f_add_scalar(1e-8)?.f_clamp_min(1e-8)?)
}

/// `n` row indices drawn with replacement with probabilities proportional to `weights`.
pub fn pf_ppo_sample(weights: &Tensor, n: usize, rng: &mut Rng) -> Result<Vec<i64>, AlgoError> {
    let w = Vec::<f64>::try_from(weights.f_to_kind(Kind::Double)?.f_flatten(0, -1)?)?;
    let mut cdf = Vec::with_capacity(w.len());
    let mut total = 0.0;
    for x in &w {
        total += x;
        cdf.push(total);
    }
    if w.is_empty() || !(total > 0.0 && total.is_finite()) {
        return Err(AlgoError::Data(format!(
            "PF-PPO weights must have a positive finite sum, got {total}"
        )));
    }
    Ok((0..n)
        .map(|_| {
            let u = rng.next_f64() * total;
            cdf.partition_point(|&c| c <= u).min(w.len() - 1) as i64
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_follow_the_weights() {
        let w = Tensor::from_slice(&[1.0f32, 0.0, 3.0]);
        let mut rng = Rng::new(7);
        let idx = pf_ppo_sample(&w, 40_000, &mut rng).expect("sample");
        let count = |i| idx.iter().filter(|&&x| x == i).count() as f64 / 40_000.0;
        assert!((count(0) - 0.25).abs() < 0.01, "{}", count(0));
        assert_eq!(count(1), 0.0);
        assert!((count(2) - 0.75).abs() < 0.01, "{}", count(2));
    }
}
