//! Megatron-style training of the decoder family: tensor parallelism (TP), pipeline
//! parallelism (PP) and data parallelism (DP) with the distributed optimizer, in Megatron's
//! rank order (`tp-cp-dp-pp`, [`crate::parallel::layout::RankLayout::megatron`]), with context parallelism (CP)
//! splitting sequences.
//!
//! - [`stage`]: [`ParallelModel`], one (TP rank, PP stage): [`crate::model::decoder`]'s layers
//!   over this rank's shards, the vocab-parallel embedding and heads, and decoding with a KV
//!   cache (what the rollout runs on a Megatron rank, [`crate::rollout::ShardedDecoder`]).
//! - [`schedule`]: 1F1B and forward-only pipeline schedules over micro-batches.
//! - [`module`]: [`MegatronModule`], the model with its groups and optimizer: micro-batched
//!   forward/backward through the schedule, gradient finalisation (tied-embedding sum over
//!   the embedding group, DP reduction), the optimizer step, and export of full weights.
//! - [`engine`]: [`MegatronEngine`], the [`crate::engine::Engine`] interface over it (what the
//!   actor, critic and reference workers drive), with checkpoints and weight export.
//! - context parallelism (sequences split over a CP group, load-balanced): [`crate::parallel::tp::context`].
//! - [`offload`]: parameter and gradient storages parked in host memory between phases.
//! - [`rollout_shards`]: the rollout's weights at another tensor parallel size.
//!
//! The pieces underneath live with their kind: the f/g mappings and the segment-wise backward
//! in [`crate::parallel::mappings`], TP regions and vocab-parallel losses in [`crate::parallel::tp`], the
//! distributed optimizer in [`crate::optim::distrib`].
pub mod engine;
pub mod module;
pub mod offload;
pub mod rollout_shards;
pub mod schedule;
pub mod stage;

pub use engine::{GroupPolicy, MegatronEngine, MegatronHead, MegatronSettings};
pub use module::{
    MegatronModule, MicroBatch, MicroImages, ModuleMemory, ModuleOptimizer, ParallelSettings,
};
pub use schedule::{ActivationSpec, Pipeline, StageStep, forward_backward_1f1b, forward_only};
pub use stage::{
    ExpertPlacement, HeadKind, ParallelModel, ParamInfo, Stage, StageImages, StageInput,
};

/// Errors of the Megatron stack.
#[derive(Debug, thiserror::Error)]
pub enum MegatronError {
    #[error("megatron: {0}")]
    Config(String),
    #[error(transparent)]
    Dist(#[from] crate::parallel::dist::DistError),
    #[error(transparent)]
    Tp(#[from] crate::parallel::tp::TpError),
    #[error(transparent)]
    Optim(#[from] crate::optim::OptimError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Algo(#[from] crate::algo::AlgoError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

pub type Result<T, E = MegatronError> = std::result::Result<T, E>;
