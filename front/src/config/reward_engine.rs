//! The reward model's own engines: the reduced FSDP settings under
//! `reward_model.model.fsdp_config`, the Megatron engine under `reward_model.megatron`, and
//! the generative reward model's inference engine under `reward_model.rollout`. Each is a
//! subset of the corresponding policy-side node.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::OpenDict;
use super::engine::{EngineDtype, WrapPolicy};
use super::rollout::{RolloutDtype, RolloutName};

/// FSDP settings of the reward model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardModelFsdpConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Auto-wrap policy.
    pub wrap_policy: WrapPolicy,
    /// Move parameters to host memory while idle.
    pub param_offload: bool,
    /// Free gathered parameters after forward.
    pub reshard_after_forward: bool,
    /// Ranks per shard group; -1 shards over all ranks.
    #[schemars(range(min = -1), extend("not" = {"const": 0}))]
    pub fsdp_size: i64,
    /// FSDP1 only: prefetch the next all-gather during forward.
    pub forward_prefetch: bool,
}

/// Megatron engine of the reward model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardModelMegatronConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc). verl
    /// names a class here that does not exist; the node is never instantiated.
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Move parameters to host memory while idle.
    pub param_offload: bool,
    /// Tensor-parallel degree.
    #[schemars(range(min = 1))]
    pub tensor_model_parallel_size: i64,
    /// Expert-parallel degree.
    #[schemars(range(min = 1))]
    pub expert_model_parallel_size: i64,
    /// Tensor-parallel degree inside expert layers; null uses `tensor_model_parallel_size`.
    #[schemars(range(min = 1))]
    pub expert_tensor_parallel_size: Option<i64>,
    /// Pipeline-parallel degree.
    #[schemars(range(min = 1))]
    pub pipeline_model_parallel_size: i64,
    /// Virtual pipeline stages per pipeline rank; null disables.
    #[schemars(range(min = 1))]
    pub virtual_pipeline_model_parallel_size: Option<i64>,
    /// Context-parallel degree.
    #[schemars(range(min = 1))]
    pub context_parallel_size: i64,
    /// Megatron sequence parallelism inside tensor-parallel groups.
    pub sequence_parallel: bool,
    /// Shard optimizer state over data-parallel ranks (unused: the reward model does not
    /// train).
    pub use_distributed_optimizer: bool,
    /// Load weights from a Megatron distributed checkpoint.
    pub use_dist_checkpointing: bool,
    /// Folder of the distributed checkpoint to load.
    pub dist_checkpointing_path: Option<String>,
    /// Key prefix inside the distributed checkpoint.
    pub dist_checkpointing_prefix: String,
    /// Random seed; mirrors the actor.
    pub seed: i64,
    /// Extra fields for Megatron's transformer config; mirrors the actor.
    pub override_transformer_config: OpenDict,
    /// Build the model through mbridge; mirrors the actor.
    pub use_mbridge: bool,
    /// Use the plain mbridge implementation; mirrors the actor.
    pub vanilla_mbridge: bool,
    /// Pack sequences without padding; mirrors the actor.
    pub use_remove_padding: bool,
    /// Compute dtype.
    pub dtype: EngineDtype,
}

/// Inference engine of a generative reward model (a reduced rollout node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardRolloutConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Inference engine; only needed for a generative reward model (the default tree leaves
    /// it unset).
    pub name: Option<RolloutName>,
    /// Weight dtype of the engine.
    pub dtype: RolloutDtype,
    /// Fraction of device memory the engine may use.
    #[schemars(range(max = 1.0), extend("exclusiveMinimum" = 0))]
    pub gpu_memory_utilization: f64,
    /// Run the engine eagerly, without CUDA graphs.
    pub enforce_eager: bool,
    /// Batch sizes to capture CUDA graphs for; null uses the engine's defaults.
    pub cudagraph_capture_sizes: Option<Vec<i64>>,
    /// Release the KV cache while idle.
    pub free_cache_engine: bool,
    /// Data-parallel degree inside each engine replica.
    #[schemars(range(min = 1))]
    pub data_parallel_size: i64,
    /// Expert-parallel degree.
    #[schemars(range(min = 1))]
    pub expert_parallel_size: i64,
    /// Tensor-parallel degree of each engine replica.
    #[schemars(range(min = 1))]
    pub tensor_model_parallel_size: i64,
    /// Token budget of one engine scheduling step.
    #[schemars(range(min = 1))]
    pub max_num_batched_tokens: i64,
    /// Context length of the engine; null uses the model's maximum.
    #[schemars(range(min = 1))]
    pub max_model_len: Option<i64>,
    /// Sequences scheduled concurrently per engine.
    #[schemars(range(min = 1))]
    pub max_num_seqs: i64,
    /// How the engine loads its weights (`auto` reads the checkpoint).
    pub load_format: String,
    /// Extra engine arguments.
    pub engine_kwargs: OpenDict,
    /// Maximum images per prompt; null means the engine default.
    #[schemars(range(min = 0))]
    pub limit_images: Option<i64>,
    /// Split long prefills into chunks.
    pub enable_chunked_prefill: bool,
    /// Reuse the KV cache of shared prompt prefixes.
    pub enable_prefix_caching: bool,
    /// Silence the engine's statistics logging.
    pub disable_log_stats: bool,
    /// Token-in/token-out engine: do not load a tokenizer inside the engine.
    pub skip_tokenizer_init: bool,
    /// Maximum prompt length of a judging request, in tokens.
    #[schemars(range(min = 1))]
    pub prompt_length: i64,
    /// Maximum judgement length, in tokens.
    #[schemars(range(min = 1))]
    pub response_length: i64,
}
