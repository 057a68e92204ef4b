//! Parallel engines of the trainable and inference roles: the FSDP engine
//! (`fsdp_config`, group `engine/fsdp.yaml`) and the Megatron engine (`megatron`, group
//! `engine/megatron.yaml`). They are mounted into the actor, the reference policy and the
//! critic.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use verlc_spec::Dtype;

use super::common::OpenDict;

/// Compute dtype of an engine's parameters, in the spellings the engine section accepts
/// (the value is a [`Dtype`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum EngineDtype {
    /// bfloat16.
    #[serde(rename = "bfloat16")]
    Bfloat16,
    /// IEEE half precision.
    #[serde(rename = "float16")]
    Float16,
    /// 32-bit float. For `megatron.dtype` a verlc extension (verl's Megatron engine accepts
    /// only bfloat16 and float16): fp32 training, fast on CPUs without native bf16.
    #[serde(rename = "float32")]
    Float32,
}

/// A torch dtype written in one of the spellings verl's precision helper accepts (the value
/// is a [`Dtype`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TorchDtype {
    /// 32-bit float.
    #[serde(rename = "fp32")]
    Fp32,
    /// 32-bit float.
    #[serde(rename = "float32")]
    Float32,
    /// 32-bit float.
    #[serde(rename = "32")]
    Bits32,
    /// IEEE half precision.
    #[serde(rename = "fp16")]
    Fp16,
    /// IEEE half precision.
    #[serde(rename = "float16")]
    Float16,
    /// IEEE half precision.
    #[serde(rename = "16")]
    Bits16,
    /// bfloat16.
    #[serde(rename = "bf16")]
    Bf16,
    /// bfloat16.
    #[serde(rename = "bfloat16")]
    Bfloat16,
}

impl EngineDtype {
    /// The dtype this spelling names.
    pub fn dtype(self) -> Dtype {
        match self {
            EngineDtype::Bfloat16 => Dtype::Bf16,
            EngineDtype::Float16 => Dtype::Fp16,
            EngineDtype::Float32 => Dtype::Fp32,
        }
    }
}

impl TorchDtype {
    /// The dtype this spelling names.
    pub fn dtype(self) -> Dtype {
        match self {
            TorchDtype::Fp32 | TorchDtype::Float32 | TorchDtype::Bits32 => Dtype::Fp32,
            TorchDtype::Fp16 | TorchDtype::Float16 | TorchDtype::Bits16 => Dtype::Fp16,
            TorchDtype::Bf16 | TorchDtype::Bfloat16 => Dtype::Bf16,
        }
    }
}

/// Which FSDP implementation wraps the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FsdpStrategy {
    /// FSDP version 1.
    #[serde(rename = "fsdp")]
    Fsdp,
    /// FSDP2 (`fully_shard`).
    #[serde(rename = "fsdp2")]
    Fsdp2,
}

/// The only strategy value a Megatron engine accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum McoreStrategy {
    /// Megatron-core.
    #[serde(rename = "megatron")]
    Megatron,
}

/// Which submodules FSDP wraps into their own shard units.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WrapPolicy {
    /// Wrap every submodule with at least this many parameters; 0 wraps by transformer layer
    /// class instead.
    #[schemars(range(min = 0))]
    pub min_num_params: i64,
    /// Layer class names to wrap; absent uses the model's own list of unsplittable modules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformer_layer_cls_to_wrap: Option<Vec<String>>,
    /// Turn auto-wrapping off (the whole model becomes one unit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable: Option<bool>,
}

/// FSDP mixed-precision dtypes; absent entries keep verl's defaults (bf16 parameters, fp32
/// reductions and buffers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MixedPrecisionConfig {
    /// Dtype parameters are cast to for compute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_dtype: Option<TorchDtype>,
    /// Dtype of gradient reductions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_dtype: Option<TorchDtype>,
    /// Dtype of module buffers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_dtype: Option<TorchDtype>,
}

/// FSDP engine: sharding, offload, sequence parallelism and numerics of one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FsdpEngineConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Auto-wrap policy.
    pub wrap_policy: WrapPolicy,
    /// Move parameters (and gradients) to host memory while the role is idle.
    pub param_offload: bool,
    /// Move optimizer state to host memory while the role is idle.
    pub optimizer_offload: bool,
    /// FSDP2 only: keep parameters on the host during training with a pinned-memory CPU
    /// offload policy (slow, saves the most device memory).
    pub offload_policy: bool,
    /// Free gathered parameters after forward (full sharding); false keeps them until
    /// backward, trading memory for less communication.
    pub reshard_after_forward: bool,
    /// Ranks per shard group; -1 shards over all ranks, a smaller value shards within groups
    /// and replicates across them (hybrid sharding).
    #[schemars(range(min = -1), extend("not" = {"const": 0}))]
    pub fsdp_size: i64,
    /// FSDP1 only: prefetch the next all-gather during forward.
    pub forward_prefetch: bool,
    /// Dtype the Hugging Face weights are loaded in before sharding.
    pub model_dtype: TorchDtype,
    /// FSDP1 only: keep the original parameters visible (needed by some optimizers and
    /// LoRA).
    pub use_orig_params: bool,
    /// Random seed of the engine.
    pub seed: i64,
    /// Force deterministic kernels (slow; for debugging).
    pub full_determinism: bool,
    /// Ulysses sequence-parallel degree; the data-parallel size becomes world size divided
    /// by it.
    #[schemars(range(min = 1))]
    pub ulysses_sequence_parallel_size: i64,
    /// Compute the entropy from logits in chunks to save memory.
    pub entropy_from_logits_with_chunking: bool,
    /// Compile the entropy computation with `torch.compile`.
    pub use_torch_compile: bool,
    /// Recompute the entropy in backward instead of storing activations.
    pub entropy_checkpointing: bool,
    /// The role only runs forward passes (no optimizer, no gradients).
    pub forward_only: bool,
    /// FSDP implementation.
    pub strategy: FsdpStrategy,
    /// Compute dtype.
    pub dtype: EngineDtype,

    /// Mixed-precision dtypes; absent uses bf16 compute with fp32 reductions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_precision: Option<MixedPrecisionConfig>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_offload: Option<bool>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_dynamic_bsz: Option<bool>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_token_len_per_gpu: Option<i64>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch_size_per_gpu: Option<i64>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infer_max_token_len_per_gpu: Option<i64>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infer_micro_batch_size_per_gpu: Option<i64>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_fused_kernels: Option<bool>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_remove_padding: Option<bool>,
}

/// Megatron engine: model parallelism, offload, checkpoint format and overrides of one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MegatronEngineConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Move parameters to host memory while the role is idle.
    pub param_offload: bool,
    /// Move gradients to host memory while the role is idle.
    pub grad_offload: bool,
    /// Move optimizer state to host memory while the role is idle.
    pub optimizer_offload: bool,
    /// Tensor-parallel degree.
    #[schemars(range(min = 1))]
    pub tensor_model_parallel_size: i64,
    /// Expert-parallel degree for mixture-of-experts layers.
    #[schemars(range(min = 1))]
    pub expert_model_parallel_size: i64,
    /// Tensor-parallel degree inside expert layers; null uses `tensor_model_parallel_size`.
    #[schemars(range(min = 1))]
    pub expert_tensor_parallel_size: Option<i64>,
    /// Pipeline-parallel degree.
    #[schemars(range(min = 1))]
    pub pipeline_model_parallel_size: i64,
    /// Virtual pipeline stages per pipeline rank (interleaved schedule); null disables.
    #[schemars(range(min = 1))]
    pub virtual_pipeline_model_parallel_size: Option<i64>,
    /// Context-parallel degree (sequence split across ranks in attention).
    #[schemars(range(min = 1))]
    pub context_parallel_size: i64,
    /// Megatron sequence parallelism inside tensor-parallel groups; turned off by verl when
    /// the tensor-parallel degree is 1.
    pub sequence_parallel: bool,
    /// Shard optimizer state over data-parallel ranks (ZeRO-1).
    pub use_distributed_optimizer: bool,
    /// Load weights from a Megatron distributed checkpoint instead of Hugging Face files.
    pub use_dist_checkpointing: bool,
    /// Folder of the distributed checkpoint to load.
    pub dist_checkpointing_path: Option<String>,
    /// Key prefix inside the distributed checkpoint.
    pub dist_checkpointing_prefix: String,
    /// Random seed of the engine.
    pub seed: i64,
    /// Extra fields for Megatron's distributed data-parallel config.
    pub override_ddp_config: OpenDict,
    /// Extra fields for Megatron's transformer config (recomputation, attention backend, …).
    pub override_transformer_config: OpenDict,
    /// Extra fields for the Megatron model built by the bridge.
    pub override_mcore_model_config: OpenDict,
    /// Build the model through mbridge instead of verl's own converters.
    pub use_mbridge: bool,
    /// Use the plain mbridge implementation rather than the Megatron-bridge one.
    pub vanilla_mbridge: bool,
    /// Pack sequences without padding (THD layout) instead of padded BSHD batches.
    pub use_remove_padding: bool,
    /// The role only runs forward passes (no optimizer, no gradients).
    pub forward_only: bool,
    /// Compute dtype.
    pub dtype: EngineDtype,

    /// Engine kind; must be `megatron` when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<McoreStrategy>,
    /// Force deterministic kernels (slow; for debugging).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_determinism: Option<bool>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_dynamic_bsz: Option<bool>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_token_len_per_gpu: Option<i64>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch_size_per_gpu: Option<i64>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infer_max_token_len_per_gpu: Option<i64>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infer_micro_batch_size_per_gpu: Option<i64>,
    /// Internal: filled in by the worker at run time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_fused_kernels: Option<bool>,
}
