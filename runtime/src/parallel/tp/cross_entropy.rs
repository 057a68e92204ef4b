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
use crate::algo::topk_kl::{MassAt, forward_kl_topk};
use crate::logits::TokenStats;
use crate::logits::topk::{TopK, TopKTargets, check_k, check_targets};
use crate::parallel::dist::ProcessGroup;
use crate::parallel::mappings::{all_gather_dim, max_over, reduce_many_from_tp_region};

/// Per-token log-probs (and the asked statistics) in f32.
#[derive(Debug)]
pub struct VocabParallelOutput {
    pub log_probs: Tensor,
    pub entropy: Option<Tensor>,
    pub sum_pi_squared: Option<Tensor>,
    /// The top-k's per-token columns ([`TopK::columns`]), when asked.
    pub topk: Option<Tensor>,
}

/// `log_softmax(logits)[labels]` (and the entropy of the softmax) from this rank's logits
/// (…, per_rank) of `partition`, labels (…) holding global token ids. Padding columns of
/// the last rank are dropped first. Divide by the temperature before calling. `topk` adds the
/// top-k output (`targets`: the teacher's top-k at the same tokens, global ids), see
/// [`vocab_parallel_topk`].
pub fn vocab_parallel_log_probs(
    logits: &Tensor,
    labels: &Tensor,
    partition: &VocabPartition,
    group: Option<&ProcessGroup>,
    stats: TokenStats,
    topk: TopK,
    targets: Option<&TopKTargets>,
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
    let topk = vocab_parallel_topk(&l, &lse, partition, group, topk, targets)?;
    Ok(VocabParallelOutput {
        log_probs: picked - lse,
        entropy,
        sum_pi_squared,
        topk,
    })
}

/// The top-k columns from this rank's valid logits `l` (…, valid) in f32 and the global
/// log-sum-exp `lse` (…): the global top-k (each rank's top candidates all-gathered, the best
/// `k` kept), and for the KL the student's log-probs at the teacher's ids, each summed from
/// its owner with an identity backward, so autograd gives Megatron's gradient
/// `m_A p_j − q_j [j ∈ A]` on each rank's own logits. Masses are verl's Megatron ones
/// (after the clamp).
fn vocab_parallel_topk(
    l: &Tensor,
    lse: &Tensor,
    partition: &VocabPartition,
    group: Option<&ProcessGroup>,
    topk: TopK,
    targets: Option<&TopKTargets>,
) -> Result<Option<Tensor>> {
    let Some(k) = topk.k() else {
        return Ok(None);
    };
    check_k(k, partition.vocab)?;
    let lse = lse.f_unsqueeze(-1)?;
    let (own, own_ids) = global_topk(&(l.f_detach()? - &lse), partition, group, k)?;
    match topk {
        TopK::Off => Ok(None),
        TopK::Own(_) => Ok(Some(Tensor::f_cat(
            &[own_ids.f_to_kind(Kind::Float)?, own],
            -1,
        )?)),
        TopK::KlToTeacher {
            log_prob_min_clamp, ..
        } => {
            let t = targets.ok_or_else(|| {
                TpError::Config("the top-k distillation loss needs the teacher's top-k".into())
            })?;
            let tokens = &l.size()[..l.dim() - 1];
            check_targets(t, tokens, k, partition.vocab)?;
            let start = partition.start();
            let outside = t
                .ids
                .f_lt(start)?
                .f_logical_or(&t.ids.f_ge(start + partition.valid())?)?;
            let local = (&t.ids - start).f_masked_fill(&outside, 0)?;
            let picked = l
                .f_gather(-1, &local, false)?
                .f_masked_fill(&outside, 0.0)?;
            let picked = reduce_many_from_tp_region(&[picked], group)?
                .pop()
                .ok_or_else(|| TpError::Config("no reduced top-k log-probs".into()))?;
            let kl = forward_kl_topk(
                &(picked - &lse),
                &t.log_probs,
                &t.ids,
                &own_ids,
                log_prob_min_clamp,
                MassAt::AfterClamp,
            )?;
            Ok(Some(kl.columns()?))
        }
    }
}

/// The `k` largest of the vocabulary-split `values` (…, valid) and their global ids: each
/// rank's best `min(k, per_rank)` (padding as −∞, so every rank sends the same count),
/// all-gathered and cut to `k`. No gradient.
fn global_topk(
    values: &Tensor,
    partition: &VocabPartition,
    group: Option<&ProcessGroup>,
    k: i64,
) -> Result<(Tensor, Tensor)> {
    let Some(g) = group.filter(|g| g.size() > 1) else {
        return Ok(values.f_topk(k, -1, true, true)?);
    };
    let missing = partition.per_rank - values.size().last().copied().unwrap_or(0);
    let values = if missing > 0 {
        let mut shape = values.size();
        if let Some(last) = shape.last_mut() {
            *last = missing;
        }
        let pad = Tensor::f_full(
            &shape[..],
            f64::NEG_INFINITY,
            (values.kind(), values.device()),
        )?;
        Tensor::f_cat(&[values, &pad], -1)?
    } else {
        values.shallow_clone()
    };
    let (v, i) = values.f_topk(k.min(partition.per_rank), -1, true, true)?;
    let all_v = all_gather_dim(&v, g, -1)?;
    let all_i = all_gather_dim(&(i + partition.start()), g, -1)?;
    let (best, at) = all_v.f_topk(k, -1, true, true)?;
    Ok((best, all_i.f_gather(-1, &at, false)?))
}

/// Cross-entropy loss per token, `-log p(label)`, from vocab-split logits.
pub fn vocab_parallel_cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    partition: &VocabPartition,
    group: Option<&ProcessGroup>,
) -> Result<Tensor> {
    Ok(vocab_parallel_log_probs(
        logits,
        labels,
        partition,
        group,
        TokenStats::default(),
        TopK::Off,
        None,
    )?
    .log_probs
    .f_neg()?)
}
