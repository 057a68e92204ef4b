//! What every engine (single, FSDP, Megatron) builds from the spec's optimizer settings,
//! written once: the optimizer configuration (precision, clipping, loss scaler, the share of
//! optimizer state kept on the host), the learning-rate scheduler attached to it, and the
//! scheduler step. Engines own their parameters and buffers and hand them in; the optimizer
//! logic is not theirs to repeat.

use verlc_spec::optim::{OptimSettings, SchedulerSettings};

use super::sched::{OptimizerParamScheduler, VerlLrScheduler};
use super::{Dtype, LrScheduler, OptimError, Optimizer, OptimizerConfig, ScalerConfig};

/// The share of the parameters whose optimizer state lives on the host: all of them with
/// `offload` (verl's `optimizer_offload`), else Megatron's `optimizer_offload_fraction`.
pub fn host_share(o: &OptimSettings) -> f64 {
    if o.offload { 1.0 } else { o.offload_fraction }
}

/// Megatron's optimizer configuration for the spec's settings, for model params at
/// `precision` (fp16 adds the dynamic loss scaler) stepped as `main` params: fp32 (copies of
/// bf16/fp16 params), or `precision` itself (bf16 only: stepped in place, state in bf16).
pub fn optimizer_config(
    o: &OptimSettings,
    precision: Dtype,
    main: Dtype,
) -> Result<OptimizerConfig, OptimError> {
    let keep_param_dtype = main != Dtype::Fp32;
    if keep_param_dtype && (main != precision || main == Dtype::Fp16) {
        return Err(OptimError::Config(format!(
            "{} main params with {} model params: only fp32 main params, or bf16 params stepped in place, are implemented",
            main.name(),
            precision.name()
        )));
    }
    Ok(OptimizerConfig {
        precision,
        keep_param_dtype,
        inner: o.inner,
        clip_grad: o.clip_grad,
        grad_norm_skip_threshold: f64::INFINITY,
        skip_nonfinite_grad_norm: true,
        log_num_zeros_in_grad: false,
        scaler: (precision == Dtype::Fp16).then(ScalerConfig::megatron_dynamic),
        offload_fraction: host_share(o),
    })
}

/// The spec's scheduler, writing its first values into `opt`'s groups.
pub fn scheduler(s: &SchedulerSettings, opt: &mut Optimizer) -> Result<LrScheduler, OptimError> {
    Ok(match s {
        SchedulerSettings::Verl(c) => {
            LrScheduler::Verl(VerlLrScheduler::new(c, opt.options_mut())?)
        }
        SchedulerSettings::Megatron(c) => {
            LrScheduler::Megatron(OptimizerParamScheduler::new(*c, opt.options_mut())?)
        }
    })
}

/// One scheduler step after an optimizer step (verl steps once per update); the learning
/// rate after it.
pub fn scheduler_step(sched: &mut LrScheduler, opt: &mut Optimizer) -> f64 {
    sched.step(1, opt.options_mut());
    current_lr(Some(opt))
}

/// The learning rate verl logs (`actor/lr`): the first group's; 0 without an optimizer.
pub fn current_lr(opt: Option<&Optimizer>) -> f64 {
    opt.and_then(Optimizer::canonical_lr).unwrap_or(0.0)
}
