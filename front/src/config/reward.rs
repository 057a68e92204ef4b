//! Rewards: verl 0.7.1+'s `reward` section ([`RewardSection`], group `reward/reward.yaml`), and
//! the 0.7.0 layout it replaced: the optional reward model, `reward_model` (groups
//! `reward_model/dp_reward_loop.yaml` and `reward_model/megatron_reward_loop.yaml`), the
//! reward manager that turns scores into token rewards, `reward_manager`, and the user's
//! scoring function, `custom_reward_function`. The reward model's own engines and rollout
//! live in [`super::reward_engine`].
//!
//! One struct covers both backends; backend-only keys are `Option` fields that may be absent.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{OpenDict, Strategy};
use super::profiler::ProfilerConfig;
use super::reward_engine::{RewardModelFsdpConfig, RewardModelMegatronConfig, RewardRolloutConfig};

/// Where a reward manager or reward loop class comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RewardSource {
    /// A name from verl's registry (`naive`, `batch`, `dapo`, `prime`, …).
    #[serde(rename = "register")]
    Register,
    /// A class imported from a Python file.
    #[serde(rename = "importlib")]
    Importlib,
}

/// The reward model's weights and (FSDP) engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardModelModelConfig {
    /// Tokenizer of the policy, used to decode responses before re-encoding them for the
    /// reward model; null when both share a chat template.
    pub input_tokenizer: Option<String>,
    /// Local folder, hub id or remote path of the reward model.
    pub path: String,
    /// Python module imported before loading; mirrors the actor's model.
    pub external_lib: Option<String>,
    /// Allow running Python code shipped with the model.
    pub trust_remote_code: bool,
    /// Entries merged into the Hugging Face model config.
    pub override_config: OpenDict,

    /// FSDP only: stage the weights in shared memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub use_shm: Option<bool>,
    /// FSDP only: pack sequences without padding tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub use_remove_padding: Option<bool>,
    /// FSDP only: use fused kernels; mirrors the actor's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub use_fused_kernels: Option<bool>,
    /// FSDP only: FSDP settings of the reward model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub fsdp_config: Option<RewardModelFsdpConfig>,
}

/// Remote code-execution sandbox used by code-scoring reward functions
/// (`reward_model.sandbox_fusion`, and `reward.sandbox_fusion` in 0.7.1+).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxFusionConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Sandbox endpoint; null disables the sandbox.
    pub url: Option<String>,
    /// Concurrent sandbox requests.
    #[schemars(range(min = 1))]
    pub max_concurrent: i64,
    /// Memory limit per execution, in MiB.
    #[schemars(range(min = 1))]
    pub memory_limit_mb: i64,
}

/// The reward model (discriminative or generative) and the reward loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardModelConfig {
    /// Score responses with a reward model (in addition to or instead of a function).
    pub enable: bool,
    /// Give the reward model its own pool of nodes instead of sharing the actor's.
    pub enable_resource_pool: bool,
    /// Accelerators per node of the separate pool.
    #[schemars(range(min = 0))]
    pub n_gpus_per_node: i64,
    /// Nodes of the separate pool.
    #[schemars(range(min = 0))]
    pub nnodes: i64,
    /// Backend of the reward model.
    pub strategy: Strategy,
    /// Model.
    pub model: RewardModelModelConfig,
    /// Deprecated: use `micro_batch_size_per_gpu`. Responses per forward pass over all ranks.
    #[schemars(range(min = 1), extend("deprecated" = true))]
    pub micro_batch_size: Option<i64>,
    /// Responses per forward pass on one rank; needed unless dynamic batching is on.
    #[schemars(range(min = 1))]
    pub micro_batch_size_per_gpu: Option<i64>,
    /// Maximum input length of the reward model; null uses prompt plus response length.
    #[schemars(range(min = 1))]
    pub max_length: Option<i64>,
    /// Form micro-batches by a token budget; mirrors the critic.
    pub use_dynamic_bsz: bool,
    /// Token budget of one micro-batch per rank; mirrors the critic.
    #[schemars(range(min = 1))]
    pub forward_max_token_len_per_gpu: i64,
    /// Deprecated: use `reward_manager.name`.
    #[schemars(extend("deprecated" = true))]
    pub reward_manager: Option<String>,
    /// Where the reward-loop manager class comes from.
    pub reward_loop_source: RewardSource,
    /// Python file of a custom reward-loop manager.
    pub reward_loop_module_path: Option<String>,
    /// Class name of a custom reward-loop manager.
    pub reward_loop_class_name: Option<String>,
    /// Compute rule-based rewards asynchronously, overlapping other work.
    pub launch_reward_fn_async: bool,
    /// Code-execution sandbox.
    pub sandbox_fusion: SandboxFusionConfig,
    /// Profiling of this role.
    pub profiler: ProfilerConfig,
    /// Compute rewards in the asynchronous reward loop.
    pub use_reward_loop: bool,
    /// Reward-loop worker processes.
    #[schemars(range(min = 1))]
    pub num_workers: i64,
    /// Inference engine of a generative reward model.
    pub rollout: RewardRolloutConfig,

    /// FSDP only: Ulysses sequence-parallel degree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("x-verlc-flavour" = "fsdp"))]
    pub ulysses_sequence_parallel_size: Option<i64>,
    /// Megatron only: timeout of collective operations, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("x-verlc-flavour" = "megatron"))]
    pub nccl_timeout: Option<i64>,
    /// Megatron only: the Megatron engine of the reward model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub megatron: Option<RewardModelMegatronConfig>,
    /// Megatron only: load the pretrained weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub load_weight: Option<bool>,
    /// Extra keyword arguments for the reward manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_kwargs: Option<OpenDict>,
}

/// A user class given as a Python file and a class name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardManagerModule {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Python file defining the reward manager; required with `source: importlib`.
    pub path: Option<String>,
    /// Name of the class in that file.
    pub name: Option<String>,
}

/// The reward manager: turns per-response scores into token-level rewards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardManagerConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Where the manager class comes from.
    pub source: RewardSource,
    /// Registered manager name (`naive`, `batch`, `dapo`, `prime`), or the class name with
    /// `source: importlib`; mirrors the deprecated `reward_model.reward_manager`.
    pub name: String,
    /// File of an imported manager.
    pub module: RewardManagerModule,
}

/// A user scoring function that replaces verl's built-in per-dataset scorers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CustomRewardFunctionConfig {
    /// Python file defining the function; null uses the built-in scorers.
    pub path: Option<String>,
    /// Function name in that file.
    pub name: String,
    /// Extra keyword arguments passed to the function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_kwargs: Option<OpenDict>,
}

/// verl 0.7.1+'s `reward` section (`verl.workers.config.RewardConfig`): the scoring function,
/// the reward manager and the reward model served by the reward loop. `crate::reward` reads
/// the settings from here or from the 0.7.0 keys, as verl's migration does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardSection {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Reward-loop worker processes.
    #[schemars(range(min = 1))]
    pub num_workers: i64,
    /// A user scoring function.
    pub custom_reward_function: CustomRewardFunctionConfig,
    /// The reward manager.
    pub reward_manager: RewardManagerConfig,
    /// The reward model, served by the reward loop.
    pub reward_model: RewardSectionModel,
    /// Code-execution sandbox of the built-in code scorers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_fusion: Option<SandboxFusionConfig>,
    /// Keyword arguments of the reward manager (DAPO's `max_resp_len`, `overlong_buffer_cfg`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_kwargs: Option<OpenDict>,
}

/// `reward.reward_model`: a reward model the reward loop serves (vLLM/SGLang in verl).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardSectionModel {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Score responses with the reward model.
    pub enable: bool,
    /// Give the reward model its own pool of nodes (then it also scores validation).
    pub enable_resource_pool: bool,
    /// Accelerators per node of the separate pool.
    #[schemars(range(min = 0))]
    pub n_gpus_per_node: i64,
    /// Nodes of the separate pool.
    #[schemars(range(min = 0))]
    pub nnodes: i64,
    /// Local folder or hub id of the reward model.
    pub model_path: Option<String>,
    /// The inference server of the reward model (verl's `RolloutConfig`).
    pub rollout: OpenDict,
}
