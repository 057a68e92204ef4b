//! The frozen reference policy, `actor_rollout_ref.ref` (groups `ref/dp_ref.yaml` and
//! `ref/megatron_ref.yaml`, both built on `ref/ref.yaml`). It computes the reference
//! log-probs for the KL loss or the in-reward KL penalty.
//!
//! One struct covers both backends; backend-only keys are `Option` fields that may be absent.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::actor::RouterReplayConfig;
use super::common::{Strategy, TiledMlpConfig};
use super::engine::{FsdpEngineConfig, MegatronEngineConfig};
use super::profiler::ProfilerConfig;

/// Override of the model the reference policy loads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefModelOverride {
    /// Path or hub id of a different reference model; null uses the actor's model.
    #[serde(default)]
    pub path: Option<String>,
    /// Not read by verl: its reference worker builds with `actor_rollout_ref.model`'s
    /// `override_config` (verl's Qwen2.5-VL TensorRT-LLM example sets it anyway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub override_config: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The frozen reference policy: batch sizes of its log-prob pass and its engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Responses per prompt; mirrors `actor_rollout_ref.rollout.n`.
    #[schemars(range(min = 1))]
    pub rollout_n: i64,
    /// Backend; mirrors the actor's strategy.
    pub strategy: Strategy,
    /// Compile hot functions with `torch.compile`; mirrors the actor.
    pub use_torch_compile: bool,
    /// Deprecated: use `log_prob_micro_batch_size_per_gpu`. Responses per log-prob forward
    /// pass over all ranks.
    #[schemars(range(min = 1), extend("deprecated" = true))]
    pub log_prob_micro_batch_size: Option<i64>,
    /// Responses per log-prob forward pass on one rank; needed unless dynamic batching is on.
    #[schemars(range(min = 1))]
    pub log_prob_micro_batch_size_per_gpu: Option<i64>,
    /// Form log-prob micro-batches by a token budget; mirrors the actor's `use_dynamic_bsz`.
    pub log_prob_use_dynamic_bsz: bool,
    /// Token budget of one log-prob micro-batch per rank with dynamic batching; mirrors the
    /// actor's `ppo_max_token_len_per_gpu`.
    #[schemars(range(min = 1))]
    pub log_prob_max_token_len_per_gpu: i64,
    /// Profiling of this role.
    pub profiler: ProfilerConfig,
    /// Mixture-of-experts routing replay.
    pub router_replay: RouterReplayConfig,

    /// FSDP only: the FSDP engine (forward only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub fsdp_config: Option<FsdpEngineConfig>,
    /// FSDP only: Ulysses sequence-parallel degree; mirrors the actor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("x-verlc-flavour" = "fsdp"))]
    pub ulysses_sequence_parallel_size: Option<i64>,
    /// FSDP only: compute the entropy from logits in chunks to save memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub entropy_from_logits_with_chunking: Option<bool>,
    /// FSDP only: recompute the entropy in backward instead of storing activations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub entropy_checkpointing: Option<bool>,
    /// FSDP only (legacy worker): load a different model as the reference policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub model: Option<RefModelOverride>,
    /// FSDP only (legacy worker): tiled MLP for the reference forward pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub tiled_mlp: Option<TiledMlpConfig>,

    /// Megatron only: the Megatron engine (forward only; parallel sizes mirror the actor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub megatron: Option<MegatronEngineConfig>,
    /// Megatron only: load the pretrained weights; must match the actor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub load_weight: Option<bool>,
}
