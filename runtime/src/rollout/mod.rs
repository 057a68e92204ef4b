//! The rollout engine: batched generation with a preallocated KV cache and left-padded prompts
//! ([`engine`]) on a [`Decoder`] ([`decoder`]: a whole [`crate::model::CausalLm`], or one
//! Megatron rank's shards decoding with its TP/PP peers), logits processing and seeded sampling
//! ([`sampling`]; on CPU from vocabulary-major logits, [`vocab_head`]), and log-probs /
//! entropy of given sequences in micro-batches through the training forward ([`logprob`], on
//! [`crate::logits`]).
//!
//! Output layout follows verl's rollout `DataProto`: `prompts` (left-padded), `responses`
//! (right-padded to the response length), `input_ids`, `attention_mask`, `position_ids`,
//! `response_mask` and `rollout_log_probs`.

pub mod agent;
pub mod decoder;
pub mod engine;
pub mod logprob;
pub mod params;
pub mod replicas;
pub mod sampling;
pub mod vllm;
pub mod vocab_head;

pub use decoder::{Decoder, RolloutLayout, ShardLayout, ShardedDecoder};
pub use engine::{
    GenerateInput, PromptStream, RolloutOutput, RowVersions, StopTokens, WeightSwap,
    from_token_rows, from_trajectory_rows, generate, generate_images, generate_interruptible,
    generate_padded, generate_streams, generate_with,
};
pub use logprob::compute_log_probs;
pub use params::{LogProbPath, MaskedTokens, SamplingParams};
pub use replicas::ReplicaShare;

/// Whole tensors by name and the version (updates) they hold.
pub type VersionedWeights = (u64, Vec<(String, tch::Tensor)>);

/// Newer weights for a rollout that is generating: `Some` when there are (a rollout beside
/// the trainer takes them between two tokens: verl's partial rollout).
pub type NewerWeights<'a> = dyn FnMut() -> Result<Option<VersionedWeights>, String> + 'a;

/// Errors of generation and log-prob computation.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("invalid sampling parameters: {0}")]
    Params(String),
    #[error("prompt {index}: {msg}")]
    Prompt { index: usize, msg: String },
    #[error("invalid batch: {0}")]
    Batch(String),
    #[error("vision inputs: {0}")]
    Vision(#[from] crate::model::vision::qwen2_5_vl::VisionError),
    #[error("{0}")]
    Torch(#[from] tch::TchError),
}
