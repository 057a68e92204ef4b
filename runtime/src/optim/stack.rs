//! What every engine (single, FSDP, Megatron) builds from the spec's optimizer settings,
//! written once: the optimizer configuration (precision, clipping, loss scaler, the share of
//! optimizer state kept on the host) and the learning-rate schedule the optimizer carries.
//! Engines own their parameters and buffers and hand them in; stepping, the schedule's step,
//! the logged lr and checkpoints are the optimizer's own methods.

use verlc_spec::optim::{OptimSettings, SchedulerSettings};

use super::sched::{OptimizerParamScheduler, VerlLrScheduler};
use super::{
    Dtype, LossScaling, LrScheduler, OptimError, Optimizer, OptimizerConfig, ParamGroup,
    ScalerConfig,
};

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

/// The optimizer an engine trains with: over `groups`, configured from the spec's settings
/// for params at `precision` stepped as `main` params (see [`optimizer_config`]), with the
/// spec's schedule attached. Every engine's optimizer comes from here, the Megatron engine's
/// through [`with_schedule`] on the optimizer its layout builds.
pub fn build(
    groups: Vec<ParamGroup>,
    o: &OptimSettings,
    precision: Dtype,
    main: Dtype,
    scaling: LossScaling,
) -> Result<Optimizer, OptimError> {
    let mut opt = Optimizer::with_scaling(groups, optimizer_config(o, precision, main)?, scaling)?;
    with_schedule(&mut opt, &o.schedule)?;
    Ok(opt)
}

/// Attaches the spec's schedule to `opt`, writing its first values into the groups.
pub fn with_schedule(opt: &mut Optimizer, s: &SchedulerSettings) -> Result<(), OptimError> {
    let sched = match s {
        SchedulerSettings::Verl(c) => {
            LrScheduler::Verl(VerlLrScheduler::new(c, opt.options_mut())?)
        }
        SchedulerSettings::Megatron(c) => {
            LrScheduler::Megatron(OptimizerParamScheduler::new(*c, opt.options_mut())?)
        }
    };
    opt.set_scheduler(sched);
    Ok(())
}
