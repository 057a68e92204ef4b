//! The value model, `critic` (groups `critic/dp_critic.yaml` and
//! `critic/megatron_critic.yaml`, both built on `critic/critic.yaml`). It is used by the
//! `gae` advantage estimator, or whenever `critic.enable` is true.
//!
//! One struct covers both backends; backend-only keys are `Option` fields that may be absent.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{CheckpointConfig, LossAggMode, OneOrMany, OpenDict, Strategy, TiledMlpConfig};
use super::engine::{FsdpEngineConfig, MegatronEngineConfig};
use super::model::LoraConfig;
use super::optim::OptimConfig;
use super::profiler::ProfilerConfig;

/// The value model's weights and (FSDP) engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CriticModelConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Local folder, hub id or remote path of the model the critic starts from.
    pub path: String,
    /// Where to read the tokenizer from; mirrors the actor's model path.
    pub tokenizer_path: Option<String>,
    /// Entries merged into the Hugging Face model config.
    pub override_config: OpenDict,
    /// Python module imported before loading; mirrors the actor's model.
    pub external_lib: Option<String>,
    /// Allow running Python code shipped with the model; mirrors the actor's model.
    pub trust_remote_code: bool,

    /// FSDP only: stage the weights in shared memory to speed up loading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub use_shm: Option<bool>,
    /// FSDP only: recompute activations in backward to save memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub enable_gradient_checkpointing: Option<bool>,
    /// FSDP only: move checkpointed activations to host memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub enable_activation_offload: Option<bool>,
    /// FSDP only: pack sequences without padding tokens; required for Ulysses sequence
    /// parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub use_remove_padding: Option<bool>,
    /// FSDP only: LoRA rank; 0 trains all weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), extend("x-verlc-flavour" = "fsdp"))]
    pub lora_rank: Option<i64>,
    /// FSDP only: LoRA scaling numerator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub lora_alpha: Option<i64>,
    /// FSDP only: LoRA target modules, `all-linear` or a list of module names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub target_modules: Option<OneOrMany<String>>,
    /// FSDP only: tiled MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub tiled_mlp: Option<TiledMlpConfig>,
    /// FSDP only: the FSDP engine of the critic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub fsdp_config: Option<FsdpEngineConfig>,
    /// Megatron only: LoRA adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub lora: Option<LoraConfig>,
}

/// The value model: batch sizes, value loss, optimizer and engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CriticConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Responses per prompt; mirrors `actor_rollout_ref.rollout.n`.
    #[schemars(range(min = 1))]
    pub rollout_n: i64,
    /// Training backend.
    pub strategy: Strategy,
    /// Run the critic; null runs it only for the `gae` estimator.
    pub enable: Option<bool>,
    /// Optimizer and learning-rate schedule.
    pub optim: OptimConfig,
    /// Model and (FSDP) engine.
    pub model: CriticModelConfig,
    /// Prompts per PPO mini-batch over all ranks; mirrors the actor.
    #[schemars(range(min = 1))]
    pub ppo_mini_batch_size: i64,
    /// Deprecated: use `ppo_micro_batch_size_per_gpu`. Responses per micro-batch over all
    /// ranks.
    #[schemars(range(min = 1), extend("deprecated" = true))]
    pub ppo_micro_batch_size: Option<i64>,
    /// Responses per forward/backward pass on one rank; needed unless `use_dynamic_bsz` is
    /// on.
    #[schemars(range(min = 1))]
    pub ppo_micro_batch_size_per_gpu: Option<i64>,
    /// Form micro-batches by a token budget; mirrors the actor.
    pub use_dynamic_bsz: bool,
    /// Token budget of a training micro-batch per rank with dynamic batching.
    #[schemars(range(min = 1))]
    pub ppo_max_token_len_per_gpu: i64,
    /// Token budget of a value-computation micro-batch per rank with dynamic batching.
    #[schemars(range(min = 1))]
    pub forward_max_token_len_per_gpu: i64,
    /// Passes over each batch; mirrors the actor.
    #[schemars(range(min = 1))]
    pub ppo_epochs: i64,
    /// Shuffle before splitting into mini-batches; mirrors the actor.
    pub shuffle: bool,
    /// Seed of the mini-batch shuffling; null (Megatron, mirrored from the actor) means
    /// unset.
    pub data_loader_seed: Option<i64>,
    /// Clip range of the value update around the old values.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub cliprange_value: f64,
    /// Reduction of per-token value losses; mirrors the actor.
    pub loss_agg_mode: LossAggMode,
    /// Constant divisor for `seq-mean-token-sum-norm`; null uses the response length. verl's
    /// tree copies the actor's (verl 0.9+; absent from older trees, whose value loss divides
    /// by the response length).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub loss_scale_factor: Option<i64>,
    /// Checkpoint contents.
    pub checkpoint: CheckpointConfig,
    /// Profiling of this role.
    pub profiler: ProfilerConfig,

    /// FSDP only. Deprecated: use `forward_micro_batch_size_per_gpu`. Responses per
    /// value-computation pass over all ranks.
    #[serde(default)]
    #[schemars(range(min = 1), extend("deprecated" = true, "x-verlc-flavour" = "fsdp"))]
    pub forward_micro_batch_size: Option<i64>,
    /// FSDP only: responses per value-computation pass on one rank.
    #[serde(default)]
    #[schemars(range(min = 1), extend("x-verlc-flavour" = "fsdp"))]
    pub forward_micro_batch_size_per_gpu: Option<i64>,
    /// FSDP only. Deprecated: use `model.fsdp_config.ulysses_sequence_parallel_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("deprecated" = true, "x-verlc-flavour" = "fsdp"))]
    pub ulysses_sequence_parallel_size: Option<i64>,
    /// FSDP only: gradient-norm clipping of the legacy FSDP worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub grad_clip: Option<f64>,
    /// verl 0.8+: the critic's FSDP engine (`critic.fsdp`; 0.7.0 keeps it at
    /// `critic.model.fsdp_config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsdp: Option<FsdpEngineConfig>,

    /// Megatron only: timeout of collective operations, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("x-verlc-flavour" = "megatron"))]
    pub nccl_timeout: Option<i64>,
    /// Megatron only: the Megatron engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub megatron: Option<MegatronEngineConfig>,
    /// Megatron only: load the pretrained weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub load_weight: Option<bool>,
}
