//! Optimizer and learning-rate schedule settings of a trainable role (`actor.optim`,
//! `critic.optim`): the inner update rule (torch's fused AdamW/SGD semantics), verl's FSDP
//! schedulers and Megatron's `OptimizerParamScheduler`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
}

impl Default for AdamWConfig {
    /// Megatron's `adam_beta1/2`, `adam_eps` defaults (torch's too).
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SgdConfig {
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
}

impl Default for SgdConfig {
    /// Megatron's `sgd_momentum=0.9`, no dampening, no Nesterov.
    fn default() -> Self {
        SgdConfig {
            momentum: 0.9,
            dampening: 0.0,
            nesterov: false,
        }
    }
}

/// Which update rule the optimizer applies.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InnerConfig {
    /// Decoupled weight decay Adam (`_fused_adamw_`).
    AdamW(AdamWConfig),
    /// SGD with momentum (`_fused_sgd_`).
    Sgd(SgdConfig),
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum VerlSchedule {
    /// `get_constant_schedule_with_warmup`.
    Constant,
    /// `get_cosine_schedule_with_warmup(min_lr_ratio, num_cycles)`.
    Cosine { min_lr_ratio: f64, num_cycles: f64 },
    /// `get_wsd_schedule_with_warmup`: warmup, then constant for `stable_ratio` of the
    /// remaining steps, then a cosine decay to `min_lr_ratio` (verl 0.7.0's legacy SFT
    /// trainer, `optim.lr_scheduler: wsd`, with the function's defaults).
    Wsd {
        min_lr_ratio: f64,
        num_cycles: f64,
        stable_ratio: f64,
    },
}

/// The `optim` keys verl's FSDP engine reads to build its scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VerlSchedulerConfig {
    pub schedule: VerlSchedule,
    /// `lr_warmup_steps`; `<= 0` means "use the ratio".
    pub lr_warmup_steps: i64,
    pub lr_warmup_steps_ratio: f64,
    pub total_training_steps: i64,
    /// `zero_indexed_step` (verl 0.9+, the FSDP engine's cosine schedule): `false` evaluates
    /// step `t` at `t + 1`. verl's default (and 0.7's only behaviour) is `true`.
    #[serde(default = "zero_indexed_default")]
    pub zero_indexed_step: bool,
}

fn zero_indexed_default() -> bool {
    true
}

impl VerlSchedulerConfig {
    /// `num_warmup_steps = lr_warmup_steps`, or `int(ratio * total)` when that is `<= 0`.
    pub fn warmup_steps(&self) -> i64 {
        if self.lr_warmup_steps <= 0 {
            (self.lr_warmup_steps_ratio * self.total_training_steps as f64) as i64
        } else {
            self.lr_warmup_steps
        }
    }
}

/// How the learning rate decays after warmup (`optim.lr_decay_style`, Megatron backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum LrDecayStyle {
    /// No decay.
    #[serde(rename = "constant")]
    Constant,
    /// Linear decay to `min_lr` over `lr_decay_steps`.
    #[serde(rename = "linear")]
    Linear,
    /// Half-cosine decay to `min_lr` over `lr_decay_steps`.
    #[serde(rename = "cosine")]
    Cosine,
    /// Decay proportional to one over the square root of the step.
    #[serde(rename = "inverse-square-root")]
    InverseSquareRoot,
    /// Warmup-stable-decay: constant, then a final decay over `lr_wsd_decay_steps`.
    #[serde(rename = "WSD")]
    Wsd,
}

/// Shape of the final decay phase of the WSD schedule (Megatron backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum WsdDecayStyle {
    /// Exponential (halving) decay.
    #[serde(rename = "exponential")]
    Exponential,
    /// Linear decay.
    #[serde(rename = "linear")]
    Linear,
    /// Half-cosine decay.
    #[serde(rename = "cosine")]
    Cosine,
    /// One minus the square root of the decay progress.
    #[serde(rename = "minus_sqrt")]
    MinusSqrt,
}

/// How weight decay changes over training (Megatron backend).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum WdIncrStyle {
    /// Weight decay stays at `weight_decay`.
    #[serde(rename = "constant")]
    #[default]
    Constant,
    /// Linear change over training.
    #[serde(rename = "linear")]
    Linear,
    /// Cosine change over training.
    #[serde(rename = "cosine")]
    Cosine,
}

/// Constructor arguments of `OptimizerParamScheduler` (step counts in samples).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MegatronSchedulerConfig {
    pub init_lr: f64,
    pub max_lr: f64,
    pub min_lr: f64,
    pub lr_warmup_steps: f64,
    pub lr_decay_steps: f64,
    pub lr_decay_style: LrDecayStyle,
    pub start_wd: f64,
    pub end_wd: f64,
    pub wd_incr_steps: f64,
    pub wd_incr_style: WdIncrStyle,
    pub wsd_decay_steps: Option<f64>,
    pub lr_wsd_decay_style: Option<WsdDecayStyle>,
}

/// The lr schedule of a trainable engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum SchedulerSettings {
    /// verl's FSDP schedulers (constant / cosine with warmup), stepped once per optimizer step.
    Verl(VerlSchedulerConfig),
    /// Megatron's `OptimizerParamScheduler`, stepped by one per optimizer step.
    Megatron(MegatronSchedulerConfig),
}

/// A role's optimizer (`actor.optim` / `critic.optim`): the update rule, rate, decay, clipping,
/// host offload and what it leaves out, with its lr schedule `S`: the spec's
/// [`crate::trainer::ScheduleSpec`] before the run's step count is known
/// ([`crate::trainer::OptimSpec`]), the [`SchedulerSettings`] it resolves to after
/// ([`OptimSettings`], what an engine builds its optimizer from).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Optim<S> {
    pub inner: InnerConfig,
    pub lr: f64,
    pub weight_decay: f64,
    /// Global grad-norm clip; `<= 0` disables clipping.
    pub clip_grad: f64,
    /// Keep the optimizer's main params and state in host memory.
    pub offload: bool,
    /// Without `offload`: the share of the parameters whose optimizer state Megatron's hybrid
    /// optimizer keeps on the host (`override_optimizer_config.optimizer_cpu_offload` with
    /// `optimizer_offload_fraction`); 0 for none.
    #[serde(default)]
    pub offload_fraction: f64,
    pub schedule: S,
    /// A vision-language model's tower (`visual.*`) keeps its loaded weights: the optimizer
    /// leaves it out (`actor.freeze_vision_tower`).
    #[serde(default)]
    pub freeze_vision_tower: bool,
}

/// An engine's optimizer: the schedule resolved for the run's step count.
pub type OptimSettings = Optim<SchedulerSettings>;
