//! Response generation, `actor_rollout_ref.rollout` (group `rollout/rollout.yaml`): the
//! inference engine, its parallel layout and memory, sampling parameters, and the
//! old-log-prob recomputation batch sizes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use verlc_spec::Dtype;

use super::agent::{AgentLoopConfig, MultiTurnConfig, TraceConfig};
use super::common::OpenDict;
use super::profiler::ProfilerConfig;

/// The inference engine that generates responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RolloutName {
    /// vLLM.
    #[serde(rename = "vllm")]
    Vllm,
    /// SGLang.
    #[serde(rename = "sglang")]
    Sglang,
    /// TensorRT-LLM (not registered in verl 0.7.0).
    #[serde(rename = "trtllm")]
    Trtllm,
    /// Plain Hugging Face `generate` (no longer registered in verl).
    #[serde(rename = "hf")]
    Hf,
    /// verlc's own built-in engine, compiled into the generated trainer.
    #[serde(rename = "verlc")]
    Verlc,
}

/// How the trainer talks to the rollout engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RolloutMode {
    /// Server-based asynchronous generation (the only supported mode).
    #[serde(rename = "async")]
    Async,
    /// Removed synchronous mode; rejected by a rule.
    #[serde(rename = "sync")]
    Sync,
}

/// Weight dtype of the rollout engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RolloutDtype {
    /// bfloat16.
    #[serde(rename = "bfloat16")]
    Bfloat16,
    /// IEEE half precision.
    #[serde(rename = "float16")]
    Float16,
    /// IEEE half precision.
    #[serde(rename = "half")]
    Half,
    /// 32-bit float.
    #[serde(rename = "float32")]
    Float32,
    /// 32-bit float.
    #[serde(rename = "float")]
    Float,
    /// The dtype stored in the model config.
    #[serde(rename = "auto")]
    Auto,
}

impl RolloutDtype {
    /// The dtype this spelling names; `None` for `auto` (the model config's).
    pub fn dtype(self) -> Option<Dtype> {
        match self {
            RolloutDtype::Bfloat16 => Some(Dtype::Bf16),
            RolloutDtype::Float16 | RolloutDtype::Half => Some(Dtype::Fp16),
            RolloutDtype::Float32 | RolloutDtype::Float => Some(Dtype::Fp32),
            RolloutDtype::Auto => None,
        }
    }
}

/// Which log-probs the engine returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum LogprobsMode {
    /// Log-softmax of the raw logits.
    #[serde(rename = "raw_logprobs")]
    RawLogprobs,
    /// Raw logits.
    #[serde(rename = "raw_logits")]
    RawLogits,
    /// Log-probs after temperature, top-k and top-p processing.
    #[serde(rename = "processed_logprobs")]
    ProcessedLogprobs,
    /// Logits after temperature, top-k and top-p processing.
    #[serde(rename = "processed_logits")]
    ProcessedLogits,
}

/// Online weight quantization of the rollout engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Quantization {
    /// FP8 weights.
    #[serde(rename = "fp8")]
    Fp8,
    /// torchao quantization described by `quantization_config_file`.
    #[serde(rename = "torchao")]
    Torchao,
}

/// Sampling parameters used for validation generations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SamplingConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Keep only the k most likely tokens; -1 keeps all.
    #[schemars(range(min = -1))]
    pub top_k: i64,
    /// Nucleus sampling mass.
    #[schemars(range(max = 1.0), extend("exclusiveMinimum" = 0))]
    pub top_p: f64,
    /// Sampling temperature; 0 is greedy.
    #[schemars(range(min = 0.0))]
    pub temperature: f64,
    /// Responses per validation prompt.
    #[schemars(range(min = 1))]
    pub n: i64,
    /// Sample instead of decoding greedily.
    pub do_sample: bool,
}

/// Prometheus metrics export of the rollout servers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrometheusConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Export metrics (requires `disable_log_stats: false`).
    pub enable: bool,
    /// Port of the Prometheus server.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i64,
    /// Prometheus configuration file written for the servers.
    pub file: String,
    /// Model name used in the metric labels; mirrors the model path.
    pub served_model_name: Option<String>,
}

/// Connection settings for an SGLang engine run as a separate server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Request timeout, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub timeout: Option<f64>,
    /// Attempts per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_attempts: Option<i64>,
    /// Wait between attempts, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub retry_delay: Option<f64>,
    /// Concurrent connections to the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_connections: Option<i64>,
    /// Longest wait for the server to come up, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub max_start_wait_time: Option<f64>,
}

/// Parameter-name mapping used when syncing Megatron weights into the rollout engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LayerNameMap {
    /// Name of the fused query/key/value projection.
    pub qkv_layer_name: String,
    /// Name of the fused gate/up projection.
    pub gate_proj_layer_name: String,
}

/// Response generation: engine, parallel layout, memory, sampling and log-prob batch sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Inference engine; mandatory (there is no default).
    pub name: RolloutName,
    /// Deprecated: only `async` is supported. Generation mode.
    #[schemars(extend("deprecated" = true))]
    pub mode: RolloutMode,
    /// Sampling temperature for training rollouts.
    #[schemars(range(min = 0.0))]
    pub temperature: f64,
    /// Keep only the k most likely tokens; -1 keeps all.
    #[schemars(range(min = -1))]
    pub top_k: i64,
    /// Nucleus sampling mass.
    #[schemars(range(max = 1.0), extend("exclusiveMinimum" = 0))]
    pub top_p: f64,
    /// Maximum prompt length in tokens; mirrors `data.max_prompt_length`.
    #[schemars(range(min = 1))]
    pub prompt_length: i64,
    /// Maximum response length in tokens; mirrors `data.max_response_length`.
    #[schemars(range(min = 1))]
    pub response_length: i64,
    /// Weight dtype of the engine.
    pub dtype: RolloutDtype,
    /// Fraction of device memory the engine may use for weights and KV cache.
    #[schemars(range(max = 1.0), extend("exclusiveMinimum" = 0))]
    pub gpu_memory_utilization: f64,
    /// Keep generating after the end-of-sequence token.
    pub ignore_eos: bool,
    /// Run the engine eagerly, without CUDA graphs.
    pub enforce_eager: bool,
    /// Batch sizes to capture CUDA graphs for; null uses the engine's defaults.
    pub cudagraph_capture_sizes: Option<Vec<i64>>,
    /// Release the KV cache (sleep the engine) while training.
    pub free_cache_engine: bool,
    /// Tensor-parallel degree of each engine replica.
    #[schemars(range(min = 1))]
    pub tensor_model_parallel_size: i64,
    /// Data-parallel degree inside each engine replica.
    #[schemars(range(min = 1))]
    pub data_parallel_size: i64,
    /// Expert-parallel degree; above 1 it must equal tensor times data parallel degree.
    #[schemars(range(min = 1))]
    pub expert_parallel_size: i64,
    /// Pipeline-parallel degree (values above 1 are not supported by vLLM/SGLang in verl).
    #[schemars(range(min = 1))]
    pub pipeline_model_parallel_size: i64,
    /// Token budget of one engine scheduling step.
    #[schemars(range(min = 1))]
    pub max_num_batched_tokens: i64,
    /// Context length of the engine; null uses the model's maximum.
    #[schemars(range(min = 1))]
    pub max_model_len: Option<i64>,
    /// Sequences scheduled concurrently per engine.
    #[schemars(range(min = 1))]
    pub max_num_seqs: i64,
    /// Split long prefills into chunks scheduled with decodes.
    pub enable_chunked_prefill: bool,
    /// Reuse the KV cache of shared prompt prefixes.
    pub enable_prefix_caching: bool,
    /// Which log-probs the engine reports.
    pub logprobs_mode: Option<LogprobsMode>,
    /// How the engine gets its initial weights: `dummy` (random; real weights are synced
    /// from the trainer), `auto`, `hf`, `safetensors`, `megatron`, …
    pub load_format: String,
    /// Deprecated: use `log_prob_micro_batch_size_per_gpu`. Responses per old-log-prob
    /// forward pass over all ranks.
    #[schemars(range(min = 1), extend("deprecated" = true))]
    pub log_prob_micro_batch_size: Option<i64>,
    /// Responses per old-log-prob forward pass on one rank; needed unless dynamic batching
    /// is on.
    #[schemars(range(min = 1))]
    pub log_prob_micro_batch_size_per_gpu: Option<i64>,
    /// Form old-log-prob micro-batches by a token budget; mirrors the actor.
    pub log_prob_use_dynamic_bsz: bool,
    /// Token budget of one old-log-prob micro-batch per rank; mirrors the actor.
    #[schemars(range(min = 1))]
    pub log_prob_max_token_len_per_gpu: i64,
    /// Silence the engine's periodic statistics logging.
    pub disable_log_stats: bool,
    /// Sample instead of decoding greedily.
    pub do_sample: bool,
    /// Responses per prompt (the group size of GRPO-style estimators).
    #[schemars(range(min = 1))]
    pub n: i64,
    /// Fraction of requests that may be aborted once the rest have finished, to cut long
    /// tails; 0 waits for all.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub over_sample_rate: f64,
    /// SGLang: wake the engine up in stages to lower peak memory.
    pub multi_stage_wake_up: bool,
    /// Extra engine arguments per engine name (`vllm`, `sglang`, …).
    pub engine_kwargs: OpenDict,
    /// Sampling for validation.
    pub val_kwargs: SamplingConfig,
    /// Multi-turn generation.
    pub multi_turn: MultiTurnConfig,
    /// Return the engine's log-probs with the responses (needed for rollout correction).
    pub calculate_log_probs: bool,
    /// Agent loop.
    pub agent: AgentLoopConfig,
    /// Bucket size for streaming weights to the engine, in MiB.
    #[schemars(range(min = 1))]
    pub update_weights_bucket_megabytes: i64,
    /// Rollout tracing.
    pub trace: TraceConfig,
    /// Reuse rollouts cached in `skip_dump_dir` (generating and caching them when missing).
    pub skip_rollout: bool,
    /// Folder of the rollout cache.
    pub skip_dump_dir: String,
    /// Token-in/token-out engine: do not load a tokenizer inside the engine.
    pub skip_tokenizer_init: bool,
    /// Record mixture-of-experts routing in the engine for routing replay.
    pub enable_rollout_routing_replay: bool,
    /// Profiling of this role; mirrors the actor's settings.
    pub profiler: ProfilerConfig,
    /// Prometheus metrics export.
    pub prometheus: PrometheusConfig,
    /// Online weight quantization; null disables.
    pub quantization: Option<Quantization>,
    /// Quantization settings file (torchao).
    pub quantization_config_file: Option<String>,

    /// Gather FSDP weights layer by layer when syncing them to the engine (slower, less
    /// memory); set by the FSDP trainer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layered_summon: Option<bool>,
    /// Megatron only: parameter names used when syncing weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub layer_name_map: Option<LayerNameMap>,
    /// Repetition penalty of sampling; 1 disables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub repetition_penalty: Option<f64>,
    /// SGLang server connection settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerConfig>,
    /// Free-form settings for custom rollout engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<OpenDict>,
    /// How SGLang is run (e.g. `local`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sglang_engine_mode: Option<String>,
    /// Maximum images per prompt for multimodal models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub limit_images: Option<i64>,
    /// Let the engine sleep (release memory) between rollouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_sleep_mode: Option<bool>,
    /// verl 0.9+: how weights reach the rollout engine after an update (replaces
    /// `update_weights_bucket_megabytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_engine: Option<CheckpointEngineConfig>,
    /// verl 0.9+: make the engine's generation bit-reproducible (batch-invariant kernels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_determinism: Option<bool>,
    /// verl 0.9+: nodes of the standalone rollout pool (`trainer.v1.trainer_mode:
    /// separate_async`, which needs it above 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub nnodes: Option<i64>,
    /// verl 0.9+: GPUs per node of the standalone rollout pool (by default
    /// `trainer.n_gpus_per_node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub n_gpus_per_node: Option<i64>,
}

/// `rollout.checkpoint_engine` (verl 0.9+).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointEngineConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Transfer backend: `naive`, `nccl`, `nixl`, `hccl`, or one a custom module registers.
    pub backend: String,
    /// Bucket size for streaming weights to the engine, in MiB.
    #[schemars(range(min = 1))]
    pub update_weights_bucket_megabytes: i64,
    /// Keyword arguments of the backend's constructor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_kwargs: Option<super::common::OpenDict>,
    /// A module imported on every worker first, to register a custom backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_backend_module: Option<String>,
}
