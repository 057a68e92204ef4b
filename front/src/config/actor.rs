//! The policy being trained, `actor_rollout_ref.actor` (groups `actor/dp_actor.yaml` and
//! `actor/megatron_actor.yaml`, both built on `actor/actor.yaml`).
//!
//! One struct covers both backends: the FSDP-only keys (`fsdp_config`, `grad_clip`, …) and
//! the Megatron-only keys (`megatron`, `load_weight`) are `Option` fields that may be absent.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{CheckpointConfig, KlEstimator, LossAggMode, OpenDict, Strategy};
use super::engine::{FsdpEngineConfig, MegatronEngineConfig};
use super::optim::OptimConfig;
use super::profiler::ProfilerConfig;

/// The policy-gradient loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PolicyLossMode {
    /// PPO clipped surrogate with dual clipping for negative advantages.
    #[serde(rename = "vanilla")]
    Vanilla,
    /// Sequence-level importance ratio (GSPO).
    #[serde(rename = "gspo")]
    Gspo,
    /// Soft, sigmoid-gated ratio instead of a hard clip (SAPO; uses `tau_pos`/`tau_neg`).
    #[serde(rename = "sapo")]
    Sapo,
    /// Plain policy gradient without a ratio (GPG).
    #[serde(rename = "gpg")]
    Gpg,
    /// PPO clip plus random detaching of high-covariance tokens (Clip-Cov).
    #[serde(rename = "clip_cov")]
    ClipCov,
    /// Unclipped ratio with a KL penalty on high-covariance tokens (KL-Cov).
    #[serde(rename = "kl_cov")]
    KlCov,
    /// Geometric mean of clipped token ratios per sequence (GMPO).
    #[serde(rename = "geo_mean")]
    GeoMean,
    /// Clipped, detached ratio weighting a REINFORCE term (CISPO).
    #[serde(rename = "cispo")]
    Cispo,
    /// Truncated ratio weighting a REINFORCE term, masked where the probability moved more than
    /// the clip ratios in total variation (DPPO-Binary-TV; verl 0.8+).
    #[serde(rename = "dppo_tv")]
    DppoTv,
    /// As `dppo_tv`, with the binary KL divergence as the trust region (DPPO-Binary-KL; verl
    /// 0.8+).
    #[serde(rename = "dppo_kl")]
    DppoKl,
    /// Policy gradient with a quadratic log-ratio penalty `dro_beta` (DRO; verl 0.9+).
    #[serde(rename = "dro")]
    Dro,
    /// Uses the rollout log-probs as the old policy; selected automatically by rollout
    /// correction's bypass mode.
    #[serde(rename = "bypass_mode")]
    BypassMode,
}

/// Parameters of the policy loss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyLossConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Which loss is used.
    pub loss_mode: PolicyLossMode,
    /// Clip-Cov: fraction of tokens whose gradient is detached.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub clip_cov_ratio: f64,
    /// Clip-Cov: lower covariance bound for candidate tokens.
    pub clip_cov_lb: f64,
    /// Clip-Cov: upper covariance bound for candidate tokens.
    pub clip_cov_ub: f64,
    /// KL-Cov: fraction of tokens that receive the KL penalty.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub kl_cov_ratio: f64,
    /// KL-Cov: weight of the KL penalty.
    pub ppo_kl_coef: f64,
    /// DRO: weight of the quadratic log-ratio penalty; must be positive with `loss_mode: dro`
    /// (verl 0.9+; absent from older trees).
    #[serde(default)]
    pub dro_beta: Option<f64>,
}

/// Mixture-of-experts routing replay mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RouterReplayMode {
    /// Routing is recomputed in training.
    #[serde(rename = "disabled")]
    Disabled,
    /// Replay the routing recorded while computing old log-probs.
    #[serde(rename = "R2")]
    R2,
    /// Replay the routing recorded by the rollout engine.
    #[serde(rename = "R3")]
    R3,
}

/// Mixture-of-experts routing replay between rollout/inference and training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouterReplayConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Replay mode.
    pub mode: RouterReplayMode,
    /// File the recorded routing decisions are written to.
    pub record_file: Option<String>,
    /// File routing decisions are replayed from.
    pub replay_file: Option<String>,
}

/// The policy being trained: batch sizes, PPO loss, KL loss, optimizer and engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActorConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Responses per prompt; mirrors `actor_rollout_ref.rollout.n`.
    #[schemars(range(min = 1))]
    pub rollout_n: i64,
    /// Training backend.
    pub strategy: Strategy,
    /// Prompts per PPO mini-batch (one optimizer step), over all ranks; each prompt
    /// contributes `rollout_n` responses.
    #[schemars(range(min = 1))]
    pub ppo_mini_batch_size: i64,
    /// Deprecated: use `ppo_micro_batch_size_per_gpu`. Responses per micro-batch over all
    /// ranks.
    #[schemars(range(min = 1), extend("deprecated" = true))]
    pub ppo_micro_batch_size: Option<i64>,
    /// Responses per forward/backward pass on one rank (gradient accumulation unit); needed
    /// unless `use_dynamic_bsz` is on.
    #[schemars(range(min = 1))]
    pub ppo_micro_batch_size_per_gpu: Option<i64>,
    /// Form micro-batches by a token budget (`ppo_max_token_len_per_gpu`) instead of a fixed
    /// number of responses.
    pub use_dynamic_bsz: bool,
    /// Token budget of one micro-batch per rank when `use_dynamic_bsz` is on; must cover the
    /// longest prompt plus response.
    #[schemars(range(min = 1))]
    pub ppo_max_token_len_per_gpu: i64,
    /// Symmetric PPO clip range of the importance ratio; the fallback for the two bounds
    /// below.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub clip_ratio: f64,
    /// Lower clip range: the ratio is clipped at 1 - clip_ratio_low.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub clip_ratio_low: f64,
    /// Upper clip range: the ratio is clipped at 1 + clip_ratio_high (DAPO's clip-higher).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub clip_ratio_high: f64,
    /// SAPO gate temperature for tokens with positive advantage.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub tau_pos: f64,
    /// SAPO gate temperature for tokens with negative advantage.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub tau_neg: f64,
    /// Keep the vision encoder of a multimodal model frozen.
    pub freeze_vision_tower: bool,
    /// Policy loss choice and its parameters.
    pub policy_loss: PolicyLossConfig,
    /// Dual-clip bound for negative advantages; must be greater than 1.
    #[schemars(extend("exclusiveMinimum" = 1))]
    pub clip_ratio_c: f64,
    /// Reduction of per-token losses.
    pub loss_agg_mode: LossAggMode,
    /// Constant divisor for `seq-mean-token-sum-norm`; null uses the response length.
    #[schemars(range(min = 1))]
    pub loss_scale_factor: Option<i64>,
    /// Weight of the entropy bonus subtracted from the loss; 0 turns it off.
    pub entropy_coeff: f64,
    /// Compute the entropy even when its coefficient is 0 (for metrics).
    pub calculate_entropy: bool,
    /// The old-log-prob pass also computes `Σ_v π_v²` per token, which the optimal token
    /// baseline estimators and the `variance_proxy/*` metrics read (verl 0.9+; absent from
    /// older trees).
    #[serde(default)]
    pub calculate_sum_pi_squared: Option<bool>,
    /// Add a KL penalty towards the reference policy to the loss (GRPO style); needs the
    /// reference policy.
    pub use_kl_loss: bool,
    /// Compile hot functions with `torch.compile`.
    pub use_torch_compile: bool,
    /// Weight of the KL loss.
    pub kl_loss_coef: f64,
    /// KL estimator used by the KL loss.
    pub kl_loss_type: KlEstimator,
    /// Passes over each batch of rollouts.
    #[schemars(range(min = 1))]
    pub ppo_epochs: i64,
    /// Shuffle the rollouts before splitting them into mini-batches.
    pub shuffle: bool,
    /// Seed of the mini-batch shuffling.
    pub data_loader_seed: i64,
    /// Checkpoint contents.
    pub checkpoint: CheckpointConfig,
    /// Optimizer and learning-rate schedule.
    pub optim: OptimConfig,
    /// Use fused kernels for the log-prob/entropy head; mirrors the model setting.
    pub use_fused_kernels: bool,
    /// Profiling of this role.
    pub profiler: ProfilerConfig,
    /// Mixture-of-experts routing replay.
    pub router_replay: RouterReplayConfig,

    /// FSDP only: the FSDP engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub fsdp_config: Option<FsdpEngineConfig>,
    /// FSDP only: gradient-norm clipping of the legacy FSDP worker (the newer engine reads
    /// `optim.clip_grad`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub grad_clip: Option<f64>,
    /// FSDP only. Deprecated: use `fsdp_config.ulysses_sequence_parallel_size`. A value above
    /// 1 is copied there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("deprecated" = true, "x-verlc-flavour" = "fsdp"))]
    pub ulysses_sequence_parallel_size: Option<i64>,
    /// FSDP only: compute the entropy from logits in chunks to save memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub entropy_from_logits_with_chunking: Option<bool>,
    /// FSDP only: recompute the entropy in backward instead of storing activations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub entropy_checkpointing: Option<bool>,
    /// FSDP only: pack sequences without padding; mirrors the model setting and is required
    /// for Ulysses sequence parallelism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub use_remove_padding: Option<bool>,

    /// Megatron only: the Megatron engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub megatron: Option<MegatronEngineConfig>,
    /// Megatron only: load the pretrained weights (false starts from random weights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub load_weight: Option<bool>,
    /// Megatron only: extra profiling options of the Megatron actor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub profile: Option<OpenDict>,

    /// Responses per log-prob forward pass on one rank; normally filled in from the rollout
    /// settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub ppo_infer_micro_batch_size_per_gpu: Option<i64>,
    /// Token budget of a log-prob forward pass per rank with dynamic batching; normally
    /// filled in from the rollout settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub ppo_infer_max_token_len_per_gpu: Option<i64>,
    /// Use the rollout engine's log-probs as the old policy instead of recomputing them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_rollout_log_probs: Option<bool>,
}
