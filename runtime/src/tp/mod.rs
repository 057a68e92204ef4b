//! Tensor-parallel building blocks (Megatron's `core/tensor_parallel`): layers that hold one
//! rank's slice of a weight and call the mappings of [`crate::dist::mappings`], the
//! vocab-parallel losses, and the shard hints that load those slices from (and gather them
//! back to) Hugging Face checkpoints.
//!
//! - [`layers`]: [`ColumnParallelLinear`] (output features split, weight dim 0),
//!   [`RowParallelLinear`] (input features split, weight dim 1, output all-reduced),
//!   [`VocabParallelEmbedding`] (vocabulary rows split).
//! - [`cross_entropy`]: log-probs, entropy and cross-entropy from vocab-sharded logits, with
//!   three small all-reduces per row and never a full-vocabulary gather.
//! - [`shard`]: which checkpoint tensor is split along which dim ([`shard::ShardSpec`]),
//!   sharded loading from safetensors, and gathering the full tensors back.
//!
//! Layers never create groups: the group is an argument (`None` is a single rank), as in
//! Megatron's `tp_group=` direction.
pub mod cross_entropy;
pub mod layers;
pub mod shard;

pub use cross_entropy::{
    VocabParallelOutput, vocab_parallel_cross_entropy, vocab_parallel_log_probs,
};
pub use layers::{ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, VocabPartition};
pub use shard::{ShardSpec, load_sharded};

use crate::dist::ProcessGroup;

/// Errors of the tensor-parallel layers.
#[derive(Debug, thiserror::Error)]
pub enum TpError {
    #[error("tensor parallelism: {0}")]
    Config(String),
    #[error(transparent)]
    Dist(#[from] crate::dist::DistError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

pub type Result<T, E = TpError> = std::result::Result<T, E>;

/// (rank, size) of a tensor-parallel group; `(0, 1)` without one.
pub fn rank_size(group: Option<&ProcessGroup>) -> (i64, i64) {
    group.map_or((0, 1), |g| (g.rank() as i64, g.size() as i64))
}

/// `n / parts`, or an error naming what does not divide.
pub fn divide(n: i64, parts: i64, what: &str) -> Result<i64> {
    if parts <= 0 || n % parts != 0 {
        return Err(TpError::Config(format!(
            "{what} ({n}) is not divisible by the tensor-parallel size ({parts})"
        )));
    }
    Ok(n / parts)
}
