//! [`TrainerSpec`]: everything a generated trainer runs, decided once by the compiler's
//! lowering (`verlc_front::plan::spec`) and embedded in the binary as JSON. The runtime's engines,
//! workers and trainer read these typed settings and never verl's config types.
//!
//! Batch sizes are per data-parallel rank and counted in responses (already × `rollout.n`),
//! the way verl's workers normalise them. The only facts left to run time are those the
//! config cannot know: the number of prompts in the dataset (hence the step count when
//! `trainer.total_training_steps` is unset) and the device index of the rank.

use serde::{Deserialize, Serialize};

use crate::algo::{
    AdvEstimator, AdvantageConfig, KlEstimator, LossAggMode, PolicyLossConfig, PolicyLossMode,
};
use crate::binding::Binding;
use crate::data::DataSpec;
use crate::optim::{
    LrDecayStyle, MegatronSchedulerConfig, Optim, OptimSettings, SchedulerSettings, VerlSchedule,
    VerlSchedulerConfig, WdIncrStyle,
};
use crate::sampling::SamplingParams;

/// The run a trainer binary executes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerSpec {
    /// What the binary is monomorphized over; the binary refuses a spec of another binding.
    pub binding: Binding,
    /// The strategy as written: FSDP1 and FSDP2 wrap alike here, Megatron differs.
    pub strategy: StrategyName,
    pub world: WorldSpec,
    pub data: DataSpec,
    /// Tokenizer directory (`model.tokenizer_path`, else the actor's model path).
    pub tokenizer_path: String,
    /// Seed of built-in models and fresh value heads (the actor engine's `seed`).
    pub model_seed: u64,
    pub actor: ActorSpec,
    /// The frozen reference policy (a KL loss or an in-reward KL penalty needs it).
    pub reference: Option<ReferenceSpec>,
    /// The value model (GAE, or `critic.enable`).
    pub critic: Option<CriticSpec>,
    pub rollout: RolloutSpec,
    pub reward: RewardSpec,
    /// How scores become rewards (`reward_manager.name`).
    pub reward_manager: RewardManagerSpec,
    /// A reward model (`reward_model.enable`): its scores replace the reward function's in
    /// training, as verl extracts `rm_scores` before calling the reward manager.
    pub reward_model: Option<RewardModelSpec>,
    pub algorithm: AlgorithmSpec,
    pub run: RunSpec,
    /// verl 0.9's on-policy distillation: the teachers that score each response (the
    /// actor's loss term is `actor.update.distillation`).
    #[serde(default)]
    pub distillation: Option<DistillationSpec>,
}

/// The teachers of on-policy distillation (`distillation.teacher_models`): forward-only models
/// that give the log-prob of every sampled response token, as the reference does but at
/// temperature 1 (verl's teacher server scores at 1 whatever the rollout's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DistillationSpec {
    /// One teacher for every row, or one per value of the rows' `data_source`
    /// (`teacher_key`).
    pub teachers: Vec<TeacherSpec>,
    /// The engine the teachers run on (the reference's settings).
    pub engine: EngineSpec,
    /// Rows per log-prob micro-batch (the reference's).
    pub micro_batch: usize,
    #[serde(default)]
    pub max_token_len: Option<usize>,
}

/// One teacher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeacherSpec {
    /// The `data_source` value of the rows it scores (`None`: every row).
    pub key: Option<String>,
    pub model_path: String,
}

/// The actor's distillation term (`distillation.distillation_loss`, verl 0.9's
/// `distillation_ppo_loss`): per response token `d` (see [`DistillationMode`]), clamped to
/// `±loss_max_clamp`; aggregated as the actor's loss (`use_policy_gradient: false`), or a
/// vanilla PPO-clip term with advantages `-d`; added to the task's PPO loss times `coef` (or
/// alone, when `use_task_rewards` is false).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DistillationLossSpec {
    pub mode: DistillationMode,
    pub use_task_rewards: bool,
    /// `distillation_loss_coef` (1 when `use_task_rewards` is false).
    pub coef: f64,
    pub loss_max_clamp: Option<f64>,
    pub use_policy_gradient: bool,
    pub clip_ratio_low: f64,
    pub clip_ratio_high: f64,
}

/// How the per-token distillation loss `d` is measured (`loss_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DistillationMode {
    /// A single-sample estimator of the student's against the teacher's log-prob of the
    /// sampled token (`k1`, `abs`, `k2`, `k3` and their aliases).
    Estimator(crate::algo::KlKind),
    /// `forward_kl_topk`: `Σ_i q_i (log q_i − log p_i)` over the teacher's `topk` most likely
    /// tokens at each position (`q` the teacher's, `p` the student's probabilities there),
    /// both log-probs clamped below at `log_prob_min_clamp`, then clamped at 0.
    ForwardKlTopk {
        topk: i64,
        log_prob_min_clamp: Option<f64>,
    },
}

/// verl's `strategy` spellings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyName {
    Fsdp,
    Fsdp2,
    Megatron,
}

/// `trainer.device`, as far as libtorch runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

/// The ranks of the run: `nnodes × n_gpus_per_node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorldSpec {
    pub device: DeviceKind,
    pub nnodes: usize,
    pub n_gpus_per_node: usize,
}

impl TrainerSpec {
    /// Where a policy (or, `as_critic`, a critic) of `family` trains on text prompts only in this
    /// run: a Qwen3.5 checkpoint (an image-text family on a text family's layers, which verlc
    /// trained as text before it had their tower) as the critic, or beside a critic (its value
    /// model is the text model with a value head). `None` where images reach it, or where it
    /// has no tower. The compiler warns of it (B022); the trainer refuses rows with images then.
    pub fn text_prompts_only(
        &self,
        family: crate::families::Family,
        as_critic: bool,
    ) -> Option<&'static str> {
        let row = family.row();
        if row.vision.is_none() || row.text == row.family {
            return None;
        }
        if as_critic {
            Some("as the critic")
        } else if self.critic.is_some() {
            Some("beside a critic")
        } else {
            None
        }
    }
}

impl WorldSpec {
    pub fn size(&self) -> usize {
        self.nnodes.saturating_mul(self.n_gpus_per_node)
    }
}

pub use crate::dtype::Dtype;

/// How one role's engine shards and offloads (its `fsdp_config` or `megatron` section).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EngineSpec {
    Fsdp(FsdpEngineSpec),
    Megatron(MegatronEngineSpec),
}

/// FSDP (verl's `FSDPEngineConfig`, as the runtime applies it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FsdpEngineSpec {
    /// Parameter shards and their gradients in host memory (`param_offload`, or FSDP2's
    /// `offload_policy`).
    pub param_offload: bool,
    /// Optimizer state in host memory (`optimizer_offload`, or FSDP2's `offload_policy`).
    pub optimizer_offload: bool,
    pub reshard_after_forward: bool,
    /// Recompute each decoder layer's forward in backward instead of keeping its
    /// activations (the role model's `enable_gradient_checkpointing`).
    pub gradient_checkpointing: bool,
    /// dtype of the gradient reduce-scatter (`mixed_precision.reduce_dtype`).
    pub reduce_dtype: Dtype,
    /// Ranks per shard group (HYBRID_SHARD); -1 shards over the whole world.
    pub fsdp_size: i64,
    /// Micro-batches run packed, without padding (the role model's `use_remove_padding`).
    #[serde(default)]
    pub remove_padding: bool,
    /// Ulysses sequence-parallel degree (`ulysses_sequence_parallel_size`); 1 is off.
    #[serde(default = "one")]
    pub ulysses: usize,
    /// dtype of the parameter shards the optimizer steps (`model_dtype`): fp32 main shards,
    /// or bf16 ones with bf16 optimizer state when the model trains in bf16 (a torch
    /// optimizer over a bf16 model, as verl's FSDP engine runs `model_dtype: bf16`).
    #[serde(default = "fp32")]
    pub main_dtype: Dtype,
}

fn fp32() -> Dtype {
    Dtype::Fp32
}

fn one() -> usize {
    1
}

fn zero_indexed_default() -> bool {
    true
}

/// Megatron (verl's `McoreEngineConfig`, as the runtime applies it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MegatronEngineSpec {
    pub tensor_parallel: usize,
    pub pipeline_parallel: usize,
    /// Megatron's sequence parallelism (only with tensor parallel > 1).
    pub sequence_parallel: bool,
    pub use_distributed_optimizer: bool,
    /// Optimizer state in host memory.
    pub optimizer_offload: bool,
    /// Parameters (and the distributed optimizer's param buffer) in host memory between
    /// phases (verl's `megatron.param_offload`).
    #[serde(default)]
    pub param_offload: bool,
    /// Gradient buffers in host memory between phases (verl's `megatron.grad_offload`).
    #[serde(default)]
    pub grad_offload: bool,
    /// `expert_model_parallel_size`: experts split over this many ranks. The engine runs 1
    /// (every rank holds every expert, split by tensor parallelism); the build refuses more
    /// for a mixture-of-experts model.
    #[serde(default = "one")]
    pub expert_parallel: usize,
    /// `expert_tensor_parallel_size` (`None`: Megatron's default, the tensor-parallel size).
    #[serde(default)]
    pub expert_tensor_parallel: Option<usize>,
    /// `context_parallel_size`: each sequence split over this many ranks.
    #[serde(default = "one")]
    pub context_parallel: usize,
    /// The mixture-of-experts router's settings from `override_transformer_config`.
    #[serde(default)]
    pub router: RouterSpec,
}

/// What Megatron's router does beyond routing, from `override_transformer_config`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RouterSpec {
    /// `moe_router_load_balancing_type` is `aux_loss` (or its per-sequence form, the same on
    /// verl's packed micro-batches); verl sets `none`.
    pub load_balancing: bool,
    /// `moe_aux_loss_coeff` (`None`: the model's `router_aux_loss_coef`, which Megatron's
    /// bridge copies).
    pub load_balancing_coeff: Option<f64>,
    /// `moe_z_loss_coeff` (0: unset).
    pub z_loss_coeff: f64,
    /// `moe_router_dtype: fp32`.
    pub fp32: bool,
}

impl EngineSpec {
    /// Optimizer state in host memory.
    pub fn optimizer_offload(&self) -> bool {
        match self {
            EngineSpec::Fsdp(f) => f.optimizer_offload,
            EngineSpec::Megatron(m) => m.optimizer_offload,
        }
    }

    /// Whether micro-batches run packed (FSDP's `use_remove_padding`; the Megatron engine
    /// computes padded batches).
    pub fn remove_padding(&self) -> bool {
        matches!(self, EngineSpec::Fsdp(f) if f.remove_padding)
    }

    /// dtype of the parameters the optimizer steps (FSDP's `model_dtype`; Megatron's main
    /// params are fp32).
    pub fn main_dtype(&self) -> Dtype {
        match self {
            EngineSpec::Fsdp(f) => f.main_dtype,
            EngineSpec::Megatron(_) => Dtype::Fp32,
        }
    }

    /// The Ulysses sequence-parallel degree (1 for Megatron).
    pub fn ulysses(&self) -> usize {
        match self {
            EngineSpec::Fsdp(f) => f.ulysses.max(1),
            EngineSpec::Megatron(_) => 1,
        }
    }
}

/// A role's optimizer with its lr schedule as the config gives it, before the step count is
/// known.
pub type OptimSpec = Optim<ScheduleSpec>;

/// The lr schedule of `optim`: verl's FSDP schedulers, or Megatron's when the section has
/// `lr_decay_style`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "snake_case")]
pub enum ScheduleSpec {
    Verl {
        schedule: VerlSchedule,
        /// `lr_warmup_steps`; `<= 0` uses the ratio.
        lr_warmup_steps: i64,
        lr_warmup_steps_ratio: f64,
        /// `zero_indexed_step` (verl 0.9+; see [`VerlSchedulerConfig`]).
        #[serde(default = "zero_indexed_default")]
        zero_indexed_step: bool,
    },
    Megatron {
        init_lr: f64,
        min_lr: f64,
        /// `lr_warmup_steps` when positive, else `floor(ratio × total)`.
        lr_warmup_steps: Option<i64>,
        lr_warmup_steps_ratio: f64,
        /// `lr_decay_steps` (`None`: the total).
        lr_decay_steps: Option<i64>,
        lr_decay_style: LrDecayStyle,
        /// `weight_decay_incr_style`. verl gives Megatron's scheduler start = end =
        /// `weight_decay` and `total_training_steps` increment steps, so every style keeps
        /// the decay at `weight_decay`; it is carried so the scheduler runs as verl's does.
        #[serde(default)]
        wd_incr_style: WdIncrStyle,
    },
}

impl Optim<ScheduleSpec> {
    /// The optimizer settings for a run of `total_steps` training steps.
    pub fn resolve(&self, total_steps: u64) -> OptimSettings {
        let total = total_steps as i64;
        let scheduler = match self.schedule {
            ScheduleSpec::Verl {
                schedule,
                lr_warmup_steps,
                lr_warmup_steps_ratio,
                zero_indexed_step,
            } => SchedulerSettings::Verl(VerlSchedulerConfig {
                schedule,
                lr_warmup_steps,
                lr_warmup_steps_ratio,
                total_training_steps: total,
                zero_indexed_step,
            }),
            ScheduleSpec::Megatron {
                init_lr,
                min_lr,
                lr_warmup_steps,
                lr_warmup_steps_ratio,
                lr_decay_steps,
                lr_decay_style,
                wd_incr_style,
            } => {
                let warmup = match lr_warmup_steps {
                    Some(w) if w > 0 => w as f64,
                    _ => (lr_warmup_steps_ratio * total as f64).floor(),
                };
                let decay = lr_decay_steps
                    .map_or(total as f64, |d| d as f64)
                    .max(warmup + 1.0);
                SchedulerSettings::Megatron(MegatronSchedulerConfig {
                    init_lr,
                    max_lr: self.lr,
                    min_lr,
                    lr_warmup_steps: warmup,
                    lr_decay_steps: decay,
                    lr_decay_style,
                    start_wd: self.weight_decay,
                    end_wd: self.weight_decay,
                    wd_incr_steps: (total as f64).max(1.0),
                    wd_incr_style,
                    wsd_decay_steps: None,
                    lr_wsd_decay_style: None,
                })
            }
        };
        Optim {
            schedule: scheduler,
            inner: self.inner,
            lr: self.lr,
            weight_decay: self.weight_decay,
            clip_grad: self.clip_grad,
            offload: self.offload,
            offload_fraction: self.offload_fraction,
            freeze_vision_tower: self.freeze_vision_tower,
        }
    }
}

/// The actor's update (`actor.*`), per data-parallel rank, in responses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorSettings {
    pub ppo_mini_batch_size: usize,
    pub ppo_micro_batch_size: usize,
    /// Micro-batch of the old-log-prob pass (`rollout.log_prob_micro_batch_size_per_gpu`).
    pub log_prob_micro_batch_size: usize,
    /// Dynamic batch size of the update: micro-batches by token count under this budget
    /// (`actor.use_dynamic_bsz`, `ppo_max_token_len_per_gpu`) instead of `ppo_micro_batch_size`.
    #[serde(default)]
    pub ppo_max_token_len: Option<usize>,
    /// Dynamic batch size of the old-log-prob pass (`rollout.log_prob_use_dynamic_bsz`,
    /// `log_prob_max_token_len_per_gpu`).
    #[serde(default)]
    pub log_prob_max_token_len: Option<usize>,
    /// verl's rollout-correction bypass mode (`algorithm.rollout_correction.bypass_mode`): the
    /// rollout's log-probs are the old policy (no old-log-prob pass) and the loss is verl's
    /// `bypass_mode` loss, which corrects each micro-batch against them.
    #[serde(default)]
    pub bypass: Option<BypassSpec>,
    pub ppo_epochs: usize,
    /// Each mini-batch runs its `ppo_epochs` before the next one starts (verl's
    /// `separate_async`, which updates one mini-batch at a time), instead of each epoch
    /// running over every mini-batch.
    #[serde(default)]
    pub epochs_per_mini_batch: bool,
    pub shuffle: bool,
    pub data_loader_seed: u64,
    pub loss_mode: PolicyLossMode,
    pub policy_loss: PolicyLossConfig,
    pub loss_agg_mode: LossAggMode,
    pub entropy_coeff: f64,
    /// Compute the entropy in the update even when `entropy_coeff` is 0 (for the metric).
    pub calculate_entropy: bool,
    /// The old-log-prob pass also computes `Σ_v π_v²` per token (verl 0.9's
    /// `actor.calculate_sum_pi_squared`): the optimal-token-baseline estimators read it.
    #[serde(default)]
    pub calculate_sum_pi_squared: bool,
    pub use_kl_loss: bool,
    pub kl_loss_coef: f64,
    pub kl_loss_type: KlEstimator,
    /// Logits are divided by the rollout temperature (verl's `meta_info.temperature`).
    pub temperature: f64,
    /// On-policy distillation's loss term (the batch carries `teacher_log_prob`).
    #[serde(default)]
    pub distillation: Option<DistillationLossSpec>,
}

/// The critic's update (`critic.*`), per data-parallel rank, in responses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriticSettings {
    pub ppo_mini_batch_size: usize,
    pub ppo_micro_batch_size: usize,
    /// Micro-batch of the value pass (`critic.forward_micro_batch_size_per_gpu`).
    pub forward_micro_batch_size: usize,
    /// Dynamic batch size of the update (`critic.use_dynamic_bsz`, `ppo_max_token_len_per_gpu`).
    #[serde(default)]
    pub ppo_max_token_len: Option<usize>,
    /// Dynamic batch size of the value pass (`forward_max_token_len_per_gpu`).
    #[serde(default)]
    pub forward_max_token_len: Option<usize>,
    pub ppo_epochs: usize,
    pub shuffle: bool,
    pub data_loader_seed: u64,
    pub cliprange_value: f64,
    pub loss_agg_mode: LossAggMode,
    /// Normaliser of `seq-mean-token-sum-norm` (`critic.loss_scale_factor`); response length
    /// if None.
    #[serde(default)]
    pub loss_scale_factor: Option<f64>,
    /// Whose aggregation the value loss follows (see [`crate::algo::AlgoRelease`]).
    #[serde(default)]
    pub release: crate::algo::AlgoRelease,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorSpec {
    pub model_path: String,
    pub engine: EngineSpec,
    pub optim: OptimSpec,
    pub update: ActorSettings,
    /// Normaliser of `seq-mean-token-sum-norm` (`loss_scale_factor`).
    pub loss_scale_factor: Option<f64>,
    /// LoRA adapters (`model.lora_rank` > 0 or `model.lora_adapter_path`): only they train.
    pub lora: Option<LoraSpec>,
    /// `config.json` keys replaced before the policy (and its reference and rollout) is built
    /// (`actor_rollout_ref.model.override_config`).
    #[serde(default)]
    pub config_overrides: serde_json::Map<String, serde_json::Value>,
}

/// The actor's LoRA adapters (verl's FSDP keys under `actor_rollout_ref.model`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraSpec {
    /// `lora_rank`.
    pub rank: usize,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `target_modules`.
    pub target_modules: ModuleSelector,
    /// `exclude_modules` (`Names([])` when unset).
    pub exclude_modules: ModuleSelector,
    /// `lora_adapter_path`: a PEFT adapter to start from; its own `adapter_config.json` then
    /// decides rank, alpha and modules (as `PeftModel.from_pretrained` does).
    pub adapter_path: Option<String>,
}

/// PEFT's ways of naming modules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum ModuleSelector {
    /// `all-linear`: every linear layer but the output layer.
    AllLinear,
    /// A list: a module whose name equals an entry or ends in `.entry`.
    Names(Vec<String>),
    /// A single string: a regular expression the whole module name must match.
    Regex(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceSpec {
    pub model_path: String,
    pub engine: EngineSpec,
    /// Rows per log-prob micro-batch.
    pub micro_batch: usize,
    /// Dynamic batch size (`ref.log_prob_use_dynamic_bsz`, `log_prob_max_token_len_per_gpu`).
    #[serde(default)]
    pub max_token_len: Option<usize>,
    pub temperature: f64,
    /// The reference is the actor with its LoRA adapters switched off (verl's `ref_in_actor`):
    /// no engine of its own, `model_path` and `engine` unused.
    pub actor_without_adapters: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriticSpec {
    pub model_path: String,
    /// Seed of the fresh value head (the critic engine's `seed`).
    pub seed: u64,
    pub engine: EngineSpec,
    pub optim: OptimSpec,
    pub update: CriticSettings,
}

/// Generation (`rollout.*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutSpec {
    pub train: SamplingParams,
    /// `rollout.val_kwargs`.
    pub val: SamplingParams,
    /// dtype of the rollout's weights (`None`: the trainer's parameter dtype, verl's `auto`).
    pub dtype: Option<Dtype>,
    /// Log the rollout/trainer probability gap (`calculate_log_probs`).
    pub calculate_log_probs: bool,
    /// The rollout's tensor parallel size on a Megatron actor (`rollout.
    /// tensor_model_parallel_size`; `None`: the actor's own layout). The rollout of an FSDP
    /// actor generates on the whole model and has none.
    #[serde(default)]
    pub tensor_parallel: Option<usize>,
    /// `rollout.name: vllm`: generate through a vLLM server the trainer starts (`None`: the
    /// native engine compiled into the binary, `rollout.name: verlc`).
    #[serde(default)]
    pub vllm: Option<VllmSpec>,
    /// `rollout.multi_turn` with the tool agent loop (`None`: one turn per sample).
    #[serde(default)]
    pub multi_turn: Option<MultiTurnSpec>,
}

/// verl's tool agent loop (`rollout.multi_turn`, `rollout.agent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MultiTurnSpec {
    /// 0: no limit.
    pub max_assistant_turns: usize,
    /// Tool rounds; 0: no limit.
    pub max_user_turns: usize,
    pub max_parallel_calls: usize,
    /// Characters.
    pub max_tool_response_length: usize,
    /// `left` (keep the end), `right` (keep the start) or `middle` (verl 0.8+'s meanings).
    pub tool_response_truncate_side: String,
    /// `multi_turn.format`: verl's name of the tool-call format (`hermes`, `qwen3_coder`).
    #[serde(default = "hermes")]
    pub format: String,
    pub tool_config_path: Option<String>,
    pub function_tool_path: Option<String>,
    /// verl 0.7's `interaction_config_path`: interactions answer turns without calls.
    #[serde(default)]
    pub interaction_config_path: Option<String>,
    /// The agent loop of a sample without an `agent_name` column (`single_turn_agent` or
    /// `tool_agent`).
    pub default_agent_loop: String,
    /// `rollout.prompt_length` (a turn generates up to `prompt + response - stream` tokens).
    pub prompt_length: usize,
    /// `data.apply_chat_template_kwargs`.
    #[serde(default)]
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// `rollout.agent.agent_loop_config_path`: the user's agent loops (Python classes).
    #[serde(default)]
    pub agent_loop_config_path: Option<String>,
    /// The composed config the user's loops are built with (`Null` without them).
    #[serde(default)]
    pub config: serde_json::Value,
}

fn hermes() -> String {
    "hermes".into()
}

/// The vLLM server of `rollout.name: vllm` (verl's server mode): how it is launched. Each
/// field is the rollout key of the same meaning; the runtime turns them into the server's
/// command line ([`VllmSpec`] keeps verl's names, not vLLM's flags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VllmSpec {
    /// `tensor_model_parallel_size`.
    pub tensor_parallel: usize,
    /// `data_parallel_size`.
    pub data_parallel: usize,
    /// `expert_parallel_size` (> 1: vLLM's `--enable-expert-parallel`).
    pub expert_parallel: usize,
    /// `gpu_memory_utilization` (CUDA only; on CPU the KV cache is `VLLM_CPU_KVCACHE_SPACE`).
    pub gpu_memory_utilization: f64,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// `max_model_len` (verl's default: prompt + response length).
    pub max_model_len: usize,
    pub enable_chunked_prefill: bool,
    pub enable_prefix_caching: bool,
    pub enforce_eager: bool,
    /// `logprobs_mode` (verl: `processed_logprobs`, after temperature).
    pub logprobs_mode: String,
    pub disable_log_stats: bool,
    /// `free_cache_engine` on CUDA: the server sleeps (frees weights and KV cache) while the
    /// trainer learns; vLLM has no sleep mode on CPU.
    pub sleep_between_steps: bool,
    /// `engine_kwargs.vllm`: extra server flags, `--key value` each.
    pub engine_kwargs: Vec<(String, serde_json::Value)>,
}

impl Default for VllmSpec {
    /// verl's rollout defaults (0.7-0.9), for sequences of up to 2048 tokens.
    fn default() -> Self {
        VllmSpec {
            tensor_parallel: 1,
            data_parallel: 1,
            expert_parallel: 1,
            gpu_memory_utilization: 0.5,
            max_num_seqs: 1024,
            max_num_batched_tokens: 8192,
            max_model_len: 2048,
            enable_chunked_prefill: true,
            enable_prefix_caching: true,
            enforce_eager: false,
            logprobs_mode: "processed_logprobs".into(),
            disable_log_stats: true,
            sleep_between_steps: true,
            engine_kwargs: Vec::new(),
        }
    }
}

/// Whether a rollout at tensor parallel `rollout_tp` can be cut from a Megatron actor at tensor
/// parallel `actor_tp` with `data_parallel` ranks: it divides `actor_tp` (rollout replicas
/// inside each training TP group), or is a multiple of it that spans whole data-parallel
/// ranks. The compiler accepts exactly these sizes and the runtime lays out exactly these.
pub fn rollout_tensor_parallel_fits(
    rollout_tp: usize,
    actor_tp: usize,
    data_parallel: usize,
) -> bool {
    match (rollout_tp, actor_tp) {
        (0, _) | (_, 0) => false,
        (r, t) if r <= t => t.is_multiple_of(r),
        (r, t) => r.is_multiple_of(t) && data_parallel.is_multiple_of(r / t),
    }
}

/// Where scores come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RewardSpec {
    /// verl's default `compute_score` by `data_source` (built-in tasks included).
    Builtin,
    /// `custom_reward_function`: a Python function in a side process.
    Python {
        path: String,
        name: String,
        reward_kwargs: serde_json::Map<String, serde_json::Value>,
    },
}

/// verl's reward managers that the trainer implements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum RewardManagerSpec {
    /// The score is the reward.
    Naive,
    /// DAPO's manager: the score (kept as `acc` in the extra info when it is a plain number)
    /// plus, with an overlong buffer, `min(-(L - (max_resp_len - len)) / len * penalty_factor, 0)`
    /// for a response of L tokens.
    Dapo {
        overlong_buffer: Option<OverlongBufferSpec>,
    },
    /// verl 0.9's GDPO manager: the naive reward, a plain-number score kept as `acc`, and
    /// `extra_info.experiment_name` (`trainer.experiment_name`) handed to the scorer.
    Gdpo { experiment_name: String },
    /// A reward manager class run in Python as verl runs it: the user's
    /// (`reward_manager.source: importlib`) or one of verl's registered managers verlc does not
    /// implement itself (verl 0.7.0's `batch` and `prime`).
    Python(Box<PythonManagerSpec>),
}

/// A Python reward manager and what verl constructs it with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PythonManagerSpec {
    /// The user's class; `None`: verl's registered manager `registered`.
    pub class: Option<crate::data::PyClass>,
    /// The registered name (`reward_manager.name`) when `class` is `None`.
    pub registered: String,
    /// The manager's keyword arguments (`reward_kwargs`).
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// `data.reward_fn_key`.
    pub reward_fn_key: String,
    /// The composed config (the reward loop's managers are built with it).
    pub config: serde_json::Value,
}

/// `reward_kwargs.overlong_buffer_cfg` with `reward_kwargs.max_resp_len`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OverlongBufferSpec {
    pub max_resp_len: f64,
    pub len: f64,
    pub penalty_factor: f64,
    /// Log `overlong_reward` and `overlong` per response.
    pub log: bool,
}

/// A discriminative reward model: a `*ForSequenceClassification` / `*ForTokenClassification`
/// checkpoint with one label, scored at the last token of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardModelSpec {
    /// `reward_model.model.path` (a directory, a Hub id or `builtin://`).
    pub model_path: String,
    /// How a response reaches the reward model.
    pub input: RewardModelInput,
    /// Parameter dtype of the reward model; `None`: the bound precision's compute dtype.
    pub dtype: Option<Dtype>,
    /// Rows per forward pass.
    pub micro_batch: usize,
    /// Seed of a `builtin://` reward model.
    pub seed: u64,
    /// Validation scores come from the reward model too (verl's reward loop on its own
    /// resource pool scores while generating); otherwise validation uses the reward function.
    pub scores_validation: bool,
}

/// The reward model's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RewardModelInput {
    /// The policy's own tokens (verl's legacy worker with `model.input_tokenizer: null`).
    PolicyTokens,
    /// The prompt's messages plus the decoded response as the assistant's turn, rendered by
    /// the reward model's own chat template and tokenizer.
    Chat {
        /// verl's reward loop: the template's leading BOS text is cut and the tokenizer adds
        /// its special tokens (vLLM's `classify` request); the legacy worker encodes the
        /// template's text without special tokens.
        add_special_tokens: bool,
        /// Longest input in tokens (`reward_model.max_length`, else the policy's prompt plus
        /// response length); `None`: no limit (the reward loop).
        max_length: Option<usize>,
        /// Which end an input longer than `max_length` loses.
        truncation: crate::data::Truncation,
    },
}

/// The KL controller of the in-reward penalty (`algorithm.kl_ctrl`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KlControlSpec {
    Fixed {
        kl_coef: f64,
    },
    Adaptive {
        kl_coef: f64,
        target_kl: f64,
        horizon: f64,
    },
}

/// `algorithm.*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlgorithmSpec {
    pub estimator: AdvEstimator,
    pub advantage: AdvantageConfig,
    /// `use_kl_in_reward`.
    pub kl_in_reward: bool,
    pub kl_penalty: KlEstimator,
    pub kl_ctrl: KlControlSpec,
    /// PF-PPO resampling (`use_pf_ppo`); verl applies it with GAE only.
    pub pf_ppo: Option<PfPpoSpec>,
    /// Rollout correction in verl's decoupled mode (`algorithm.rollout_correction`): importance
    /// weights and rejection of the old policy against the rollout's own log-probs.
    #[serde(default)]
    pub rollout_correction: Option<RolloutCorrectionSpec>,
    /// The reward components `gdpo` normalises one by one (`algorithm.gdpo_reward_keys`,
    /// `gdpo_reward_weights`); set with that estimator only.
    #[serde(default)]
    pub gdpo: Option<GdpoSpec>,
    /// DAPO dynamic sampling (`algorithm.filter_groups`): only prompt groups whose metric
    /// varies train; the step regenerates until it has `train_batch_size` of them.
    #[serde(default)]
    pub filter_groups: Option<FilterGroupsSpec>,
}

/// `algorithm.filter_groups` as the trainer runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FilterGroupsSpec {
    pub metric: GroupMetric,
    /// Generation rounds per step before the run stops (`max_num_gen_batches`); 0 is no limit.
    pub max_rounds: usize,
}

/// What decides whether a group varies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupMetric {
    /// The sequence score before any in-reward KL (`reward`: the reward function's or the
    /// reward model's).
    Score,
    /// A key of the reward function's result dict (`acc`, …).
    Extra(String),
}

/// GDPO's reward components: keys of the reward function's result dict, each normalised
/// within its group before the weighted sum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GdpoSpec {
    pub keys: Vec<String>,
    /// One weight per key; `None` weighs them equally.
    pub weights: Option<Vec<f64>>,
}

/// `algorithm.rollout_correction` with `bypass_mode: false`, applied before the advantages to
/// rows whose rollout log-probs the rollout returned (`rollout.calculate_log_probs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutCorrectionSpec {
    /// `rollout_is`: truncated importance weights per token or per sequence.
    pub is_level: Option<IsLevel>,
    /// `rollout_is_threshold`: the truncation bound, or IcePop's upper bound.
    pub is_threshold: f64,
    /// IcePop's lower bound (`rollout_is_threshold: "lower_upper"`, verl 0.8+): weights outside
    /// `[lower, upper]` are zeroed instead of truncated.
    #[serde(default)]
    pub is_threshold_lower: Option<f64>,
    /// `rollout_is_batch_normalize`.
    pub is_batch_normalize: bool,
    /// `rollout_rs` with its `[lower, upper]` bounds on the ratio.
    pub rejection: Option<RejectionSpec>,
    /// `rollout_token_veto_threshold`: a sequence with a token ratio below it is rejected.
    pub veto_threshold: Option<f64>,
    /// verl 0.9's rejection criteria (`rollout_rs: "token_k1,seq_max_k2"`): a token is kept
    /// when it passes every one.
    #[serde(default)]
    pub criteria: Vec<RsCriterion>,
    /// Which release's correction this is: its metrics (and whether the veto exists).
    #[serde(default)]
    pub form: CorrectionForm,
}

/// verl changed what rollout correction reports in 0.8.0: the importance-weight metrics are
/// taken from the applied (truncated or IcePop) weights, their out-of-range fractions from the
/// raw ones, with per-sequence statistics; the veto and its metrics are gone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionForm {
    /// verl 0.7's: metrics of the untruncated weights, veto metrics always.
    #[default]
    Verl07,
    /// verl 0.8 and later.
    Verl08,
}

/// One of verl 0.9's rejection options (`{token,seq_sum,seq_mean,seq_max}_{k1,k2,k3}`) with
/// its bounds. The statistic is the estimator of `l = clamp(log π_train − log π_rollout, ±20)`
/// per token (`k1 = −l`, `k2 = ½l²`, `k3 = eˡ − 1 − l`), or its sum, mean or maximum over the
/// sequence; `k1` is kept in `[ln lower, ln upper]`, the others at or below `upper`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RsCriterion {
    /// The option as verl names it (its metrics carry it).
    pub name: String,
    pub aggregate: RsAggregate,
    pub estimator: crate::algo::KlKind,
    /// `k1` only.
    pub lower: Option<f64>,
    pub upper: f64,
}

/// How a rejection option aggregates its token statistic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RsAggregate {
    Token,
    SeqSum,
    SeqMean,
    SeqMax,
}

/// The bypass-mode policy loss: the correction of [`RolloutCorrectionSpec`] computed per
/// micro-batch between the current policy and the rollout's, then `loss`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BypassSpec {
    pub correction: RolloutCorrectionSpec,
    pub loss: BypassLoss,
}

/// `algorithm.rollout_correction.loss_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BypassLoss {
    /// PPO's clipped loss against the rollout policy, without importance weights.
    PpoClip,
    /// `−A · log π · w` with the truncated importance weights `w`.
    Reinforce,
}

/// Granularity of the importance weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsLevel {
    Token,
    Sequence,
}

/// Rejection sampling: which ratio is bounded, and the bounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RejectionSpec {
    pub level: RsLevel,
    pub lower: f64,
    pub upper: f64,
}

/// Granularity of rejection sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RsLevel {
    /// Each token's ratio.
    Token,
    /// The product of the sequence's token ratios.
    Sequence,
    /// Their geometric mean.
    Geometric,
}

/// `algorithm.pf_ppo`: resample the batch by weights of each response's summed score.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PfPpoSpec {
    pub method: PfPpoMethod,
    /// Exponent of the `pow` method.
    pub weight_pow: f64,
}

/// `algorithm.pf_ppo.reweight_method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PfPpoMethod {
    /// `|score| ^ weight_pow`.
    Pow,
    /// 1 for the highest and lowest scores, 0 otherwise.
    MaxMin,
    /// 0.4 for the highest score, 0.1 otherwise.
    MaxRandom,
}

/// Where a run resumes from (`trainer.resume_mode`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum ResumeSpec {
    Disable,
    /// The latest checkpoint under the checkpoint directory, if any.
    Auto,
    /// `resume_from_path` (a `global_step_N` directory).
    Path {
        path: String,
    },
}

/// The experiment trackers the trainer feeds (`trainer.logger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoggerKind {
    Console,
    File,
    Tensorboard,
    /// Weights & Biases (verl's `wandb`, and its deprecated `tracking`).
    Wandb,
    Mlflow,
}

/// The loop: step count, validation, checkpoints, logging (`trainer.*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// `total_training_steps` (`None`: `total_epochs` over the dataset).
    pub total_training_steps: Option<u64>,
    pub total_epochs: u64,
    /// Validate every `test_freq` steps (0: never).
    pub test_freq: u64,
    /// Checkpoint every `save_freq` steps (0: never).
    pub save_freq: u64,
    pub critic_warmup: u64,
    pub val_before_train: bool,
    pub val_only: bool,
    /// `default_local_dir`.
    pub checkpoint_dir: String,
    pub resume: ResumeSpec,
    /// Checkpoints kept (`None`: all).
    pub max_actor_ckpt_to_keep: Option<usize>,
    pub max_critic_ckpt_to_keep: Option<usize>,
    pub del_local_ckpt_after_load: bool,
    pub rollout_data_dir: Option<String>,
    pub project_name: String,
    pub experiment_name: String,
    pub loggers: Vec<LoggerKind>,
    /// verl 0.9's asynchronous trainer (`trainer.v1.trainer_mode: colocate_async`); `None`:
    /// the synchronous loop.
    #[serde(default)]
    pub asynchronous: Option<AsyncSpec>,
}

/// The replay-buffer loop of verl 0.9's asynchronous trainers: a rollout beside the trainer
/// on the same rank generates queued prompt groups with the newest published weights while the
/// trainer updates; each step queues one batch and trains on the oldest finished groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AsyncSpec {
    /// Which of verl's modes the config chose (the loop is the same; see `parameter_sync_step`).
    #[serde(default)]
    pub mode: AsyncMode,
    /// `separate_async`: the step's batch trains as this many mini-batch updates between two
    /// weight syncs (`train_batch_size = parameter_sync_step × ppo_mini_batch_size`); 1 for
    /// `colocate_async`.
    #[serde(default = "one")]
    pub parameter_sync_step: usize,
    /// Prompts queued before the first step (`num_warmup_batches` × `train_batch_size`, in
    /// whole `gen_batch_size` chunks, as verl 0.9.1 rounds it).
    pub warmup_prompts: usize,
    /// `trainer.v1.sampler.max_off_policy_threshold`: the versions a trained group may span
    /// (`None`: unbounded, verl 0.9.1's null).
    pub max_off_policy_threshold: Option<u64>,
    /// `trainer.v1.sampler.max_off_policy_strategy`.
    pub strategy: OffPolicyStrategy,
    /// `separate_async` with the built-in rollout: the rollout pool's processes
    /// (`rollout.nnodes × rollout.n_gpus_per_node`), one replica per trainer rank, each in a
    /// process of its own. 0: the rollout runs beside each rank (a thread; with vLLM, its
    /// server).
    #[serde(default)]
    pub rollout_processes: usize,
}

/// verl 0.9's asynchronous trainer modes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AsyncMode {
    #[default]
    ColocateAsync,
    /// verl's rollout pool on devices of its own: with the built-in rollout, a replica process
    /// per trainer rank (`AsyncSpec::rollout_processes`).
    SeparateAsync,
}

/// What happens to prompt groups older than the threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffPolicyStrategy {
    /// Evicted and replaced by fresh prompts.
    Drop,
    /// Sampling waits for in-flight groups at the threshold to finish.
    Wait,
}
