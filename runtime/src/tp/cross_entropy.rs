//! Log-probs, entropy and cross-entropy from logits split over the vocabulary (Megatron's
//! `vocab_parallel_cross_entropy`, plus verl's entropy), without gathering the vocabulary.
//!
//! Per row, with `m` the global max, `S = Σ_v exp(l_v - m)` and `T = Σ_v exp(l_v - m) l_v`:
//! `log p(y) = l_y - (m + log S)`, `H = m + log S - T / S` and, with `Q = Σ_v exp(l_v - m)²`,
//! `Σ_v p_v² = Q / S²`. Each rank computes its partial
//! `S_r`, `T_r` and `l_y` (zero unless it owns `y`); one MAX all-reduce and one SUM all-reduce
//! (of the three partials together) give the global values. The sums pass through
//! [`reduce_many_from_tp_region`] (identity backward), so the gradient each rank computes for
//! its own logits, `onehot - softmax` for the log-prob, is already the exact one: the global
//! terms enter only as values. The shift `m` carries no gradient (the result does not depend
//! on it).
//!
//! Everything runs in f32, like the single-process path ([`crate::rollout::logprob`]).
use tch::{Kind, Tensor};

use super::{Result, TpError, VocabPartition};
use crate::dist::ProcessGroup;
use crate::dist::mappings::{max_over, reduce_many_from_tp_region};
use crate::rollout::TokenStats;

/// Per-token log-probs (and the asked statistics) in f32.
#[derive(Debug)]
pub struct VocabParallelOutput {
    pub log_probs: Tensor,
    pub entropy: Option<Tensor>,
    pub sum_pi_squared: Option<Tensor>,
}

/// `log_softmax(logits)[labels]` (and the entropy of the softmax) from this rank's logits
/// (…, per_rank) of `partition`, labels (…) holding global token ids. Padding columns of
/// the last rank are dropped first. Divide by the temperature before calling.
pub fn vocab_parallel_log_probs(
    logits: &Tensor,
    labels: &Tensor,
    partition: &VocabPartition,
    group: Option<&ProcessGroup>,
    stats: TokenStats,
) -> Result<VocabParallelOutput> {
    let l = logits
        .f_narrow(-1, 0, partition.valid())?
        .f_to_kind(Kind::Float)?;
    let m = max_over(&l.f_amax(&[-1i64][..], true)?, group)?;
    let e = (&l - &m).f_exp()?;
    let s_local = e.f_sum_dim_intlist(-1i64, false, Kind::Float)?;
    let start = partition.start();
    let outside = labels
        .f_lt(start)?
        .f_logical_or(&labels.f_ge(start + partition.valid())?)?;
    let local = (labels - start).f_masked_fill(&outside, 0)?;
    let picked = l
        .f_gather(-1, &local.f_unsqueeze(-1)?, false)?
        .f_squeeze_dim(-1)?
        .f_masked_fill(&outside, 0.0)?;
    // Σ e·l gives the entropy and Σ e² the squared probabilities, once divided by the
    // global Σ e (every partial is reduced in one call).
    let mut partials = vec![s_local, picked];
    if stats.entropy {
        partials.push((&e * &l).f_sum_dim_intlist(-1i64, false, Kind::Float)?);
    }
    if stats.sum_pi_squared {
        partials.push(e.f_square()?.f_sum_dim_intlist(-1i64, false, Kind::Float)?);
    }
    let sums = reduce_many_from_tp_region(&partials, group)?;
    if sums.len() != partials.len() {
        return Err(TpError::Config(format!(
            "{} partial sums came back for {}",
            sums.len(),
            partials.len()
        )));
    }
    let (s, picked) = (&sums[0], &sums[1]);
    let lse = s.f_log()? + m.f_squeeze_dim(-1)?;
    let mut rest = sums[2..].iter();
    let entropy = match stats.entropy.then(|| rest.next()).flatten() {
        Some(t) => Some(&lse - t.f_div(s)?),
        None => None,
    };
    let sum_pi_squared = match stats.sum_pi_squared.then(|| rest.next()).flatten() {
        Some(q) => Some(q.f_div(&s.f_square()?)?),
        None => None,
    };
    Ok(VocabParallelOutput {
        log_probs: picked - lse,
        entropy,
        sum_pi_squared,
    })
}

/// Cross-entropy loss per token, `-log p(label)`, from vocab-split logits.
pub fn vocab_parallel_cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    partition: &VocabPartition,
    group: Option<&ProcessGroup>,
) -> Result<Tensor> {
    Ok(
        vocab_parallel_log_probs(logits, labels, partition, group, TokenStats::default())?
            .log_probs
            .f_neg()?,
    )
}
