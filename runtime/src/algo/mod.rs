//! verl's RL algorithm math (docs/algorithms.md), on tch tensors shaped like verl's:
//! `[batch, response_len]` with a `response_mask` of the same shape.
//!
//! - [`advantage`]: every advantage estimator verl registers (`algorithm.adv_estimator`).
//! - [`policy_loss`]: every policy loss verl registers (`actor.policy_loss.loss_mode`) and the metrics
//!   verl logs for it (`actor/pg_clipfrac`, `actor/ppo_kl`, `actor/pg_clipfrac_lower`).
//! - [`agg`]: `loss_agg_mode`, with verl's global-batch normalisations.
//! - [`kl`]: verl's KL estimators, including the straight-through `"+"` variants.
//! - [`kl_ctrl`]: fixed and adaptive KL controllers and the in-reward KL penalty.
//! - [`value_loss`]: the critic's clipped value loss.
//! - [`entropy`]: entropy from logits and the entropy term of the actor loss.
//! - [`masked`]: masked sum / mean / variance / whitening with verl's epsilons.
//! - [`pf_ppo`]: PF-PPO's score-weighted resampling of the batch.
//! - [`rollout_correction`]: importance weights and rejection against the rollout's log-probs.
//! - [`distillation`], [`topk_kl`]: on-policy distillation's loss term and its top-k forward KL.
//! - [`sft_loss`]: the supervised fine-tuning loss on a packed batch.
//!
//! Names (`AdvEstimator`, `PolicyLossMode`, `LossAggMode`, `KlEstimator`) parse and print verl's
//! exact spellings, so config values map one to one.
pub mod advantage;
pub mod agg;
mod check;
pub mod distillation;
pub mod entropy;
pub mod kl;
pub mod kl_ctrl;
pub mod masked;
pub mod pf_ppo;
pub mod policy_loss;
pub mod rejection;
pub mod rollout_correction;
pub mod sft_loss;
pub mod topk_kl;
pub mod value_loss;
pub mod variance_proxy;

pub use advantage::{
    AdvEstimator, AdvantageConfig, AdvantageInputs, Advantages, GroupIndex, compute_advantage,
};
pub use agg::{AggOptions, AlgoRelease, LossAggMode, agg_loss};
pub use kl::{KlEstimator, KlKind, kl_penalty};
pub use kl_ctrl::{KlController, KlPenalty, apply_kl_penalty};
pub use policy_loss::{
    PolicyLoss, PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, PolicyLossMode,
    compute_policy_loss,
};
pub use value_loss::{ValueLoss, compute_value_loss};

/// A one-element tensor's value as `f64` (for metrics), whatever its dtype.
pub(crate) fn item(t: &tch::Tensor) -> Result<f64> {
    Ok(t.f_to_kind(tch::Kind::Double)?.f_double_value(&[])?)
}

/// Errors of the algorithm functions: bad shapes or inputs (the caller's data), invalid
/// parameters (the config), or libtorch failures.
#[derive(Debug, thiserror::Error)]
pub enum AlgoError {
    #[error("{name}: expected shape {expected}, got {got:?}")]
    Shape {
        name: &'static str,
        expected: String,
        got: Vec<i64>,
    },
    #[error("{name} is on {got:?} but {reference} is on {expected:?}")]
    Device {
        name: &'static str,
        reference: &'static str,
        expected: tch::Device,
        got: tch::Device,
    },
    #[error("{name}: expected a floating-point tensor, got {kind:?}")]
    Kind { name: &'static str, kind: tch::Kind },
    #[error("{what} requires `{input}`, which was not given")]
    MissingInput {
        what: &'static str,
        input: &'static str,
    },
    #[error("invalid parameter: {0}")]
    Config(String),
    #[error("{0}")]
    Data(String),
    #[error(transparent)]
    UnknownName(#[from] verlc_spec::names::UnknownName),
    #[error("{0}")]
    Unsupported(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

pub type Result<T, E = AlgoError> = std::result::Result<T, E>;
