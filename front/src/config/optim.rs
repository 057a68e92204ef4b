//! Optimizer and learning-rate schedule of a trainable role (`actor.optim`, `critic.optim`).
//!
//! verl has one group file per backend (`optim/fsdp.yaml`, `optim/megatron.yaml`) that share
//! the first nine keys. verlc models both with one struct, [`OptimConfig`], holding the union
//! of the keys: shared keys are plain fields, and keys that exist for one backend only are
//! `Option` fields that may be absent (their doc says "FSDP only" or "Megatron only", and the
//! schema carries `x-verlc-flavour`). A rule checks that flavour-only keys match the role's
//! strategy.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// The schedule vocabulary is the spec's (one enum per concept, verl's spellings there).
pub use verlc_spec::optim::{
    LrDecayStyle, WdIncrStyle as WeightDecayIncrStyle, WsdDecayStyle as LrWsdDecayStyle,
};

use super::common::OpenDict;

/// Learning-rate schedule after warm-up (FSDP backends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum LrSchedulerType {
    /// Keep the peak learning rate after warm-up.
    #[serde(rename = "constant")]
    Constant,
    /// Cosine decay towards `min_lr_ratio` times the peak.
    #[serde(rename = "cosine")]
    Cosine,
}

/// Optimizer and learning-rate schedule of a trainable role; the union of the FSDP and
/// Megatron optimizer groups (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OptimConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Optimizer name. FSDP: a class name looked up in `optimizer_impl` (e.g. `AdamW`);
    /// Megatron: `adam` or `sgd`.
    pub optimizer: String,
    /// Peak learning rate.
    #[schemars(range(min = 0.0))]
    pub lr: f64,
    /// Warm-up length as a fraction of the total training steps; used when
    /// `lr_warmup_steps` is not positive.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub lr_warmup_steps_ratio: f64,
    /// Total optimizer steps of the run; -1 means the trainer fills it in from the data size
    /// and epochs.
    pub total_training_steps: i64,
    /// Decoupled weight decay coefficient.
    #[schemars(range(min = 0.0))]
    pub weight_decay: f64,
    /// Warm-up length in steps; a value of 0 or less (or null) defers to
    /// `lr_warmup_steps_ratio`.
    pub lr_warmup_steps: Option<i64>,
    /// Adam's (beta1, beta2) moment decay rates; ignored by optimizers without betas.
    pub betas: [f64; 2],
    /// Maximum global gradient L2 norm before clipping (Megatron: a value of 0 or less turns
    /// clipping off). The legacy FSDP workers read the role's `grad_clip` instead.
    pub clip_grad: f64,
    /// Extra keyword arguments for the optimizer constructor (FSDP) or Megatron's
    /// `OptimizerConfig` (Megatron); null or empty adds nothing.
    pub override_optimizer_config: Option<OpenDict>,

    /// FSDP only: Python module the optimizer class is taken from (e.g. `torch.optim`,
    /// `bitsandbytes.optim`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub optimizer_impl: Option<String>,
    /// FSDP only: floor of the cosine schedule as a fraction of the peak learning rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0), extend("x-verlc-flavour" = "fsdp"))]
    pub min_lr_ratio: Option<f64>,
    /// FSDP only: number of cosine periods over the decay phase (0.5 is a single half-wave).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub num_cycles: Option<f64>,
    /// FSDP only (verl 0.9+): whether the cosine schedule counts steps from 0 (`true`,
    /// verl's default) or from 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub zero_indexed_step: Option<bool>,
    /// FSDP only: schedule after warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "fsdp"))]
    pub lr_scheduler_type: Option<LrSchedulerType>,
    /// FSDP only. Deprecated: use `lr_scheduler_type`. When set it replaces
    /// `lr_scheduler_type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("deprecated" = true, "x-verlc-flavour" = "fsdp"))]
    pub warmup_style: Option<LrSchedulerType>,
    /// Deprecated: use `clip_grad`. When set it replaces `clip_grad`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("deprecated" = true))]
    pub grad_clip: Option<f64>,

    /// Megatron only: learning rate at the start of warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0), extend("x-verlc-flavour" = "megatron"))]
    pub lr_warmup_init: Option<f64>,
    /// Megatron only: steps over which the learning rate decays; null uses
    /// `total_training_steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("x-verlc-flavour" = "megatron"))]
    pub lr_decay_steps: Option<i64>,
    /// Megatron only: decay shape after warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub lr_decay_style: Option<LrDecayStyle>,
    /// Megatron only: learning-rate floor reached at the end of decay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0), extend("x-verlc-flavour" = "megatron"))]
    pub min_lr: Option<f64>,
    /// Megatron only: how weight decay evolves over training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub weight_decay_incr_style: Option<WeightDecayIncrStyle>,
    /// Megatron only: shape of the final decay of the `WSD` schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub lr_wsd_decay_style: Option<LrWsdDecayStyle>,
    /// Megatron only: length of the final decay of the `WSD` schedule, in steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("x-verlc-flavour" = "megatron"))]
    pub lr_wsd_decay_steps: Option<i64>,
    /// Megatron only: take the schedule state from the checkpoint instead of this config
    /// when resuming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-verlc-flavour" = "megatron"))]
    pub use_checkpoint_opt_param_scheduler: Option<bool>,
}
