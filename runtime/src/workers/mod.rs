//! The worker roles of verl's PPO loop (docs/training-loop.md), on top of an
//! [`crate::engine::Engine`]:
//!
//! - [`actor`]: old log-probs and entropy; the PPO update (epochs × mini-batches ×
//!   micro-batches) with the policy loss, entropy bonus and KL loss.
//! - [`critic`]: values; the clipped value update.
//! - [`reference`]: frozen reference log-probs.
//! - [`rollout`]: the hybrid engine's generator: its own copy of the policy in the rollout
//!   dtype, refreshed from the actor after every update.
//! - [`rollout_pool`]: `separate_async`'s rollout pool: a replica of the rollout in a process
//!   of its own per trainer rank.
//! - [`reward`]: rule scorers chosen by `data_source`, or the user's Python
//!   `compute_score` served by a long-lived subprocess.
//!
//! Batches are [`crate::engine::Batch`]es in verl's layout: `input_ids`, `attention_mask`,
//! `position_ids` `(N, P + R)`; `responses`, `response_mask` `(N, R)`; plus what each step
//! adds (`old_log_probs`, `ref_log_prob`, `values`, `advantages`, `returns`).

pub mod actor;
pub mod critic;
pub mod reference;
pub mod reward;
pub mod rollout;
pub mod rollout_pool;
pub mod teacher;

use tch::{Kind, Tensor};

use crate::engine::micro::dynamic_parts;
use crate::engine::{Batch, Engine, EngineError, Metrics, MicroBatching};

/// Errors of the worker roles.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Algo(#[from] crate::algo::AlgoError),
    #[error(transparent)]
    Rollout(#[from] crate::rollout::RolloutError),
    #[error(transparent)]
    Reward(#[from] reward::RewardError),
    #[error("invalid worker configuration: {0}")]
    Config(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

pub type Result<T, E = WorkerError> = std::result::Result<T, E>;

/// Lists of metric values, reduced by mean at the end (verl's `append_to_dict` +
/// `reduce_metrics`).
#[derive(Debug, Default, Clone)]
pub struct MetricLists(std::collections::BTreeMap<String, Vec<f64>>);

impl MetricLists {
    pub fn push(&mut self, name: &str, value: f64) {
        self.0.entry(name.to_owned()).or_default().push(value);
    }

    pub fn extend(&mut self, m: &Metrics) {
        for (k, v) in m {
            self.push(k, *v);
        }
    }

    /// Mean of each list.
    pub fn reduce(&self) -> Metrics {
        self.0
            .iter()
            .map(|(k, v)| (k.clone(), v.iter().sum::<f64>() / v.len().max(1) as f64))
            .collect()
    }
}

/// Sums `additive` keys and averages the others over micro-batch metrics: the losses are
/// shares of the batch loss (globally normalised), the fractions are per micro-batch means.
/// How a pass cuts `batch`: `rows` per micro-batch, or with a token budget (verl's dynamic
/// batch size) parts balanced by the rows' valid tokens, as many on every rank.
pub(crate) fn micro_batching<E: Engine>(
    engine: &E,
    batch: &Batch,
    rows: usize,
    max_token_len: Option<usize>,
) -> Result<MicroBatching> {
    let Some(budget) = max_token_len else {
        return Ok(MicroBatching::Rows(rows));
    };
    let mask = batch.get("attention_mask")?;
    let lengths = Vec::<i64>::try_from(mask.f_sum_dim_intlist(1i64, false, Kind::Int64)?)?;
    Ok(MicroBatching::Parts(dynamic_parts(
        &lengths,
        budget,
        |n| engine.max_over_ranks(n),
    )?))
}

pub(crate) fn combine_micro(micro: &[Metrics], additive: &[&str]) -> Metrics {
    let mut lists = MetricLists::default();
    let mut sums = Metrics::new();
    let mut extremes = Metrics::new();
    for m in micro {
        for (k, v) in m {
            if additive.contains(&k.as_str()) {
                *sums.entry(k.clone()).or_insert(0.0) += v;
            } else if let Some(pick) = extreme(k) {
                let e = extremes.entry(k.clone()).or_insert(*v);
                *e = pick(*e, *v);
            } else {
                lists.push(k, *v);
            }
        }
    }
    let mut out = lists.reduce();
    out.extend(sums);
    out.extend(extremes);
    out
}

/// Metrics verl reduces over micro-batches by their minimum or maximum.
fn extreme(key: &str) -> Option<fn(f64, f64) -> f64> {
    match key {
        "actor/distillation/loss_min"
        | "actor/distillation/student_mass_min"
        | "actor/distillation/teacher_mass_min" => Some(f64::min),
        "actor/distillation/loss_max"
        | "actor/distillation/student_mass_max"
        | "actor/distillation/teacher_mass_max" => Some(f64::max),
        _ => None,
    }
}

/// A scalar tensor as f64.
pub(crate) fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.f_detach()?.f_to_kind(Kind::Double)?.f_double_value(&[])?)
}

/// The rows of one PPO epoch (actor and critic updates): a permutation seeded by
/// `(seed, step, epoch)` when `shuffle`, else the batch in order.
pub(crate) fn epoch_rows(
    batch: &Batch,
    shuffle: bool,
    seed: u64,
    step: u64,
    epoch: usize,
) -> Result<Batch> {
    if !shuffle {
        return Ok(batch.shallow_clone());
    }
    let mut order: Vec<i64> = (0..batch.rows()).collect();
    crate::rng::Rng::derive(seed, step.wrapping_mul(1 << 16).wrapping_add(epoch as u64))
        .shuffle(&mut order);
    Ok(batch.select(&order)?)
}
