//! The optimizer stack, to Megatron-core semantics (docs/optimizer.md):
//! fp32 main params for bf16/fp16 models, loss scaling, found-inf reduced over the
//! model-parallel group, skip on overflow, global fp32 grad norm and clipping, zero counting,
//! fused AdamW / SGD, copy back, optional host offload of a fraction of the optimizer, and
//! exact-resume checkpoints.
//!
//! - [`Optimizer`]: `MixedPrecisionOptimizer` / `FP32Optimizer` of Megatron, one type.
//! - [`param_groups`]: Megatron's standard groups (no decay for biases and 1-D params,
//!   decoupled lr for embedding/output) and verl's single group.
//! - [`sched`]: verl's FSDP schedulers and Megatron's `OptimizerParamScheduler`.
//! - [`scaler`]: constant and dynamic grad scalers.
//! - [`clip`]: fp32 grad norm (L2 / inf), clip by total norm, count zeros.
//! - [`distrib`]: Megatron's distributed optimizer (ZeRO-1) on its contiguous-buffer layout.
//! - [`stack`]: what every engine builds from the spec's settings (config, scheduler, step).
pub mod clip;
pub mod distrib;
mod inner;
mod optimizer;
pub mod param_groups;
pub mod scaler;
pub mod sched;
pub mod stack;
mod state;

pub use inner::{AdamWConfig, InnerConfig, SgdConfig};
pub use optimizer::{Dtype, Optimizer, OptimizerConfig, StepOutcome};
pub use param_groups::{GroupOptions, NamedParam, ParamGroup};
pub use scaler::{GradScaler, LossScaler, LossScaling, ScalerConfig};
pub use sched::LrScheduler;

#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    #[error("invalid optimizer configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Kernel(#[from] crate::ops::OpError),
    #[error(transparent)]
    Dist(#[from] crate::parallel::dist::DistError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        path: std::path::PathBuf,
        message: String,
    },
}

pub type Result<T, E = OptimError> = std::result::Result<T, E>;
