//! Tensor-parallel building blocks (Megatron's `core/tensor_parallel`): layers that hold one
//! rank's slice of a weight and call the mappings of [`crate::parallel::mappings`], the
//! vocab-parallel losses, and the shard hints that load those slices from (and gather them
//! back to) Hugging Face checkpoints.
//!
//! - [`layers`]: [`VocabParallelEmbedding`] (vocabulary rows split). Column- and row-split
//!   linears are the decoder's own [`crate::model::layers::Linear`].
//! - [`regions`]: how the one decoder crosses its tensor-parallel boundaries on a rank's
//!   shards, in training ([`TrainingRegions`], with the tape) and in decoding
//!   ([`InferenceRegions`]).
//! - [`cross_entropy`]: log-probs, entropy and cross-entropy from vocab-sharded logits, with
//!   three small all-reduces per row and never a full-vocabulary gather.
//! - [`shard`]: a tensor split as the model says it splits
//!   ([`crate::model::tensor_parallel::ShardSpec`]),
//!   sharded loading from safetensors, and gathering the full tensors back.
//!
//! Layers never create groups: the group is an argument (`None` is a single rank), as in
//! Megatron's `tp_group=` direction.
pub mod context;
pub mod cross_entropy;
pub mod layers;
pub mod regions;
pub mod shard;

pub use cross_entropy::{
    VocabParallelOutput, vocab_parallel_cross_entropy, vocab_parallel_log_probs,
};
pub use layers::{VocabParallelEmbedding, VocabPartition};
pub use regions::{InferenceRegions, TrainingRegions};
pub use shard::load_sharded;

use crate::parallel::dist::ProcessGroup;

/// Errors of the tensor-parallel layers.
#[derive(Debug, thiserror::Error)]
pub enum TpError {
    #[error("tensor parallelism: {0}")]
    Config(String),
    /// A sequence a context-parallel layout cannot split.
    #[error("context parallelism: {0}")]
    Context(String),
    #[error(transparent)]
    Dist(#[from] crate::parallel::dist::DistError),
    /// A model layer's collective (an expert exchange, a routing count).
    #[error(transparent)]
    Collective(#[from] crate::model::rank_group::CollectiveError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Algo(#[from] crate::algo::AlgoError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

pub type Result<T, E = TpError> = std::result::Result<T, E>;

/// (rank, size) of a tensor-parallel group; `(0, 1)` without one.
pub fn rank_size(group: Option<&ProcessGroup>) -> (i64, i64) {
    group.map_or((0, 1), |g| (g.rank() as i64, g.size() as i64))
}
