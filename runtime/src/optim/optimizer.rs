//! [`Optimizer`]: Megatron's `Float16OptimizerWithFloat16Params` / `FP32Optimizer` step,
//! as driven by `ChainedOptimizer.step()`, with `HybridDeviceOptimizer`-style host offload.
//!
//! Main params are grouped into *chunks*, one per (param group, placement, main dtype):
//! - a **flat** chunk holds copies of its params in one contiguous buffer on one device, with a
//!   matching grad buffer, in the main dtype (fp32; bf16 with `keep_param_dtype`): bf16/fp16
//!   params, and any param whose optimizer is offloaded to the host;
//! - an **aliased** chunk is the model params themselves (no copy), stepped in place: fp32
//!   params, or bf16 ones with `keep_param_dtype`.
//!
//! A flat chunk is stepped with one fused-kernel call over its whole buffer.
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::clip::{self, NormType};
use super::inner::{self, InnerConfig, SlotState};
use super::param_groups::{GroupOptions, ParamGroup};
use super::scaler::{GradScaler, LossScaler, LossScaling, ScalerConfig};
use super::sched::LrScheduler;
use super::{OptimError, Result};
use crate::ops;
use crate::parallel::dist::ProcessGroup;

/// Training precision, which picks the Megatron wrapper: `Fp32` is `FP32Optimizer` (params are
/// the main params; no scaler); `Bf16` and `Fp16` are `Float16OptimizerWithFloat16Params`
/// (fp16 requires a scaler, bf16 has none unless `loss_scale`). fp32 params of an fp16 run are
/// stepped in place (FSDP's fp32 main shards of an fp16 model).
pub use verlc_spec::Dtype;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    pub precision: Dtype,
    pub inner: InnerConfig,
    /// Global L2 clip threshold; `<= 0` disables clipping (the norm is still computed).
    pub clip_grad: f64,
    /// Skip the update when the grad norm exceeds this (Megatron's `grad_norm_skip_threshold`).
    pub grad_norm_skip_threshold: f64,
    /// Skip the update when the grad norm is inf/nan (verl's FSDP actor does).
    pub skip_nonfinite_grad_norm: bool,
    pub log_num_zeros_in_grad: bool,
    pub scaler: Option<ScalerConfig>,
    /// Fraction (by element count, greedy over params in group order) whose main params and
    /// optimizer state live on the host (Megatron's `optimizer_offload_fraction`).
    pub offload_fraction: f64,
    /// bf16 params are their own main params: stepped in place with state in bf16, as torch's
    /// default AdamW (foreach, op by op) steps a bf16 model (verl's FSDP `model_dtype: bf16`),
    /// instead of Megatron's fp32 copies. Host-offloaded state stays in bf16 too.
    #[serde(default)]
    pub keep_param_dtype: bool,
}

impl OptimizerConfig {
    /// Megatron's defaults for a precision: AdamW(0.9, 0.999, 1e-8), clip 1.0, dynamic scaler
    /// for fp16 only, no offload.
    pub fn megatron(precision: Dtype) -> Self {
        OptimizerConfig {
            precision,
            inner: InnerConfig::AdamW(Default::default()),
            clip_grad: 1.0,
            grad_norm_skip_threshold: f64::INFINITY,
            skip_nonfinite_grad_norm: false,
            log_num_zeros_in_grad: false,
            scaler: (precision == Dtype::Fp16).then(ScalerConfig::megatron_dynamic),
            offload_fraction: 0.0,
            keep_param_dtype: false,
        }
    }
}

/// What one [`Optimizer::step`] did (Megatron's `(update_successful, grad_norm, num_zeros)`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutcome {
    pub update_successful: bool,
    /// None when the step was skipped for inf/nan grads.
    pub grad_norm: Option<f64>,
    pub num_zeros: Option<u64>,
}

pub(crate) struct ModelParam {
    pub(crate) name: String,
    pub(crate) tensor: Tensor,
}

pub(crate) struct FlatMember {
    pub(crate) param: usize,
    pub(crate) offset: i64,
    pub(crate) main: Tensor,
    pub(crate) grad: Tensor,
}

pub(crate) enum Storage {
    Flat {
        main: Tensor,
        grad: Tensor,
        members: Vec<FlatMember>,
    },
    /// Slot i is the model param `members[i]`.
    Aliased { members: Vec<usize> },
}

pub(crate) struct Chunk {
    pub(crate) offloaded: bool,
    pub(crate) in_norm: bool,
    pub(crate) storage: Storage,
    pub(crate) slots: Vec<SlotState>,
}

pub(crate) struct GroupData {
    pub(crate) params: Vec<ModelParam>,
    pub(crate) chunks: Vec<Chunk>,
}

/// Megatron-core optimizer over param groups; see the module docs.
pub struct Optimizer {
    pub(crate) config: OptimizerConfig,
    pub(crate) groups: Vec<GroupData>,
    pub(crate) options: Vec<GroupOptions>,
    pub(crate) scaler: Option<Box<dyn LossScaler>>,
    /// Parameters that differ over a group of ranks which hold the same copies of the others
    /// (Megatron's experts over the expert-parallel group): their squared norms are summed
    /// over it before the norm's usual reduction.
    pub(crate) local_params: Option<LocalParams>,
    /// The learning-rate (and weight-decay) schedule that writes into `options`, saved and
    /// restored with the optimizer's state: an optimizer and its schedule are one value.
    pub(crate) scheduler: Option<LrScheduler>,
}

/// See [`Optimizer::set_local_params`].
pub(crate) struct LocalParams {
    pub(crate) group: ProcessGroup,
    pub(crate) is_local: fn(&str) -> bool,
    pub(crate) share: f64,
}

/// (device, offloaded, aliased, in_norm, main kind) of a chunk.
type ChunkKey = (Device, bool, bool, bool, Kind);

/// Where a chunk's main params live and what they are.
struct ChunkPlace {
    device: Device,
    offloaded: bool,
    aliased: bool,
    in_norm: bool,
    /// dtype of its main params and state (fp32, or bf16 with `keep_param_dtype`).
    kind: Kind,
}

/// Elements from one stream of a flat chunk to the next: the length rounded up to whole
/// pages, plus 37 pages, so no two streams share their alignment to a large power of two.
fn stream_stride(len: i64) -> i64 {
    const PAGE: i64 = 1024; // 4 KiB of fp32 elements (2 KiB of bf16 ones: still page-granular shifts)
    (len + PAGE - 1) / PAGE * PAGE + 37 * PAGE
}

fn is_float16(k: Kind) -> bool {
    matches!(k, Kind::BFloat16 | Kind::Half)
}

impl Optimizer {
    /// An optimizer with Megatron's grad scalers linked (see [`Optimizer::with_scaling`]).
    pub fn new(groups: Vec<ParamGroup>, config: OptimizerConfig) -> Result<Self> {
        Self::with_scaling(groups, config, LossScaling::LINKED)
    }

    /// An optimizer whose grad scaler, if `config` asks for one, comes from `scaling`: trainer
    /// binaries pass their precision's, so only fp16 ones link loss-scaling code.
    pub fn with_scaling(
        groups: Vec<ParamGroup>,
        config: OptimizerConfig,
        scaling: LossScaling,
    ) -> Result<Self> {
        let c = &config;
        if !(0.0..=1.0).contains(&c.offload_fraction) {
            return Err(OptimError::Config(format!(
                "offload_fraction {} must be in [0, 1]",
                c.offload_fraction
            )));
        }
        match (c.precision, c.scaler) {
            (Dtype::Fp32, Some(_)) => {
                return Err(OptimError::Config(
                    "the fp32 optimizer takes no grad scaler".into(),
                ));
            }
            (Dtype::Fp16, None) => {
                return Err(OptimError::Config(
                    "fp16 needs a grad scaler (constant or dynamic)".into(),
                ));
            }
            (Dtype::Fp16, _) if c.keep_param_dtype => {
                return Err(OptimError::Config(
                    "fp16 params need fp32 main params (keep_param_dtype is for bf16)".into(),
                ));
            }
            _ => {}
        }
        let scaler = c.scaler.map(|s| scaling.build(s)).transpose()?;
        let total: i64 = groups
            .iter()
            .flat_map(|g| &g.params)
            .map(|p| p.tensor.numel() as i64)
            .sum();
        let threshold = c.offload_fraction * total as f64;
        let mut offloaded = 0i64;
        let mut seen_names = std::collections::HashSet::new();
        let mut seen_storage = std::collections::HashMap::new();
        let mut options = Vec::with_capacity(groups.len());
        let mut data = Vec::with_capacity(groups.len());
        for group in groups {
            options.push(group.options);
            let mut params = Vec::with_capacity(group.params.len());
            let mut plan: Vec<(ChunkKey, Vec<usize>)> = Vec::new();
            // Frozen params are left alone (Megatron keeps them out of the main groups).
            for p in group
                .params
                .into_iter()
                .filter(|p| p.tensor.requires_grad())
            {
                let i = params.len();
                if !seen_names.insert(p.name.clone()) {
                    return Err(OptimError::Config(format!(
                        "param {} is listed twice",
                        p.name
                    )));
                }
                let ptr = p.tensor.data_ptr() as usize;
                if let Some(other) = seen_storage.insert(ptr, p.name.clone()) {
                    return Err(OptimError::Config(format!(
                        "params {other} and {} share storage (tied weights must be listed once)",
                        p.name
                    )));
                }
                let kind = p.tensor.kind();
                if kind != Kind::Float && !is_float16(kind) {
                    return Err(OptimError::Config(format!(
                        "param {} has dtype {kind:?}; expected fp32, bf16 or fp16",
                        p.name
                    )));
                }
                if c.precision == Dtype::Fp32 && kind != Kind::Float {
                    return Err(OptimError::Config(format!(
                        "param {} is {kind:?} but the precision is fp32",
                        p.name
                    )));
                }
                let offload = c.offload_fraction > 0.0 && (offloaded as f64) < threshold;
                if offload {
                    offloaded += p.tensor.numel() as i64;
                }
                let main_kind = if c.keep_param_dtype {
                    kind
                } else {
                    Kind::Float
                };
                let aliased = !offload && kind == main_kind;
                let device = if offload {
                    Device::Cpu
                } else {
                    p.tensor.device()
                };
                let key = (device, offload, aliased, p.in_grad_norm, main_kind);
                match plan.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, v)) => v.push(i),
                    None => plan.push((key, vec![i])),
                }
                params.push(ModelParam {
                    name: p.name,
                    tensor: p.tensor,
                });
            }
            let mut chunks = Vec::with_capacity(plan.len());
            for ((device, offloaded, aliased, in_norm, kind), members) in plan {
                let place = ChunkPlace {
                    device,
                    offloaded,
                    aliased,
                    in_norm,
                    kind,
                };
                chunks.push(Self::make_chunk(&c.inner, &params, place, members)?);
            }
            data.push(GroupData { params, chunks });
        }
        Ok(Optimizer {
            config,
            groups: data,
            options,
            scaler,
            local_params: None,
            scheduler: None,
        })
    }

    fn make_chunk(
        cfg: &InnerConfig,
        params: &[ModelParam],
        place: ChunkPlace,
        members: Vec<usize>,
    ) -> Result<Chunk> {
        let ChunkPlace {
            device,
            offloaded,
            aliased,
            in_norm,
            kind,
        } = place;
        if aliased {
            let slots = members
                .iter()
                .map(|&i| SlotState::new(cfg, &params[i].tensor))
                .collect::<Result<_>>()?;
            return Ok(Chunk {
                offloaded,
                in_norm,
                storage: Storage::Aliased { members },
                slots,
            });
        }
        let total: i64 = members
            .iter()
            .map(|&i| params[i].tensor.numel() as i64)
            .sum();
        // The chunk's streams (main params, grads, Adam's two moments) share one allocation,
        // `stream_stride` elements apart. As separate allocations of equal size they would sit
        // a page apart, and when that size is a multiple of a large power of two (as
        // transformer weights are), the fused step over streams that aligned ran 1.45x slower
        // on a 2-core AMD EPYC (bench/optim_step).
        let adam = matches!(cfg, InnerConfig::AdamW(_));
        let streams = if adam { 4 } else { 2 };
        let stride = stream_stride(total);
        let mut arena = Tensor::f_zeros([stride * streams], (kind, device))?;
        // Host buffers serving a GPU model are pinned, so D2H / H2D copies run at full speed.
        if let Some(gpu) = members
            .iter()
            .map(|&i| params[i].tensor.device())
            .find(|d| d.is_cuda())
            && device == Device::Cpu
        {
            arena = arena.f_pin_memory(gpu)?;
        }
        let stream = |k: i64| arena.f_narrow(0, k * stride, total);
        let main = stream(0)?;
        let grad = stream(1)?;
        let mut flat = Vec::with_capacity(members.len());
        let mut offset = 0i64;
        tch::no_grad(|| -> Result<()> {
            for &i in &members {
                let p = &params[i].tensor;
                let n = p.numel() as i64;
                let mut mv = main.f_narrow(0, offset, n)?.f_view(p.size().as_slice())?;
                let gv = grad.f_narrow(0, offset, n)?.f_view(p.size().as_slice())?;
                mv.f_copy_(&p.f_detach()?)?;
                flat.push(FlatMember {
                    param: i,
                    offset,
                    main: mv,
                    grad: gv,
                });
                offset += n;
            }
            Ok(())
        })?;
        let slots = vec![if adam {
            SlotState::adam(stream(2)?, stream(3)?)?
        } else {
            SlotState::new(cfg, &main)?
        }];
        Ok(Chunk {
            offloaded,
            in_norm,
            storage: Storage::Flat {
                main,
                grad,
                members: flat,
            },
            slots,
        })
    }

    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// Group hyper-parameters (what schedulers write).
    pub fn options(&self) -> &[GroupOptions] {
        &self.options
    }

    pub fn options_mut(&mut self) -> &mut [GroupOptions] {
        &mut self.options
    }

    /// The lr to log: the first group without an lr override (Megatron's
    /// `get_canonical_lr_for_logging`), if any.
    pub fn canonical_lr(&self) -> Option<f64> {
        self.options.iter().find(|o| o.default_config).map(|o| o.lr)
    }

    /// The lr verl logs (`actor/lr`): the canonical one, 0 where no group has it.
    pub fn lr(&self) -> f64 {
        self.canonical_lr().unwrap_or(0.0)
    }

    /// Attaches `scheduler`, which writes its current values into the groups now.
    pub fn set_scheduler(&mut self, scheduler: LrScheduler) {
        scheduler.apply(&mut self.options);
        self.scheduler = Some(scheduler);
    }

    /// The attached schedule, if any.
    pub fn scheduler(&self) -> Option<&LrScheduler> {
        self.scheduler.as_ref()
    }

    /// One scheduler step after an optimizer update, the learning rate after it: Megatron's
    /// schedule advances by `increment` (samples, or 1 per update as verl steps it), verl's by
    /// one update. Without a schedule the rates stay as they are.
    pub fn scheduler_step(&mut self, increment: u64) -> f64 {
        if let Some(s) = self.scheduler.as_mut() {
            s.step(increment, &mut self.options);
        }
        self.lr()
    }

    /// A copy of the grad scaler's state.
    pub fn scaler(&self) -> Option<GradScaler> {
        self.scaler.as_ref().map(|s| s.state())
    }

    /// Current loss scale (1 without a scaler).
    pub fn loss_scale(&self) -> f64 {
        self.scaler.as_ref().map_or(1.0, |s| s.scale() as f64)
    }

    /// `loss * loss_scale` (what backward should see).
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        Ok(match &self.scaler {
            Some(s) => loss.f_mul_scalar(s.scale() as f64)?,
            None => loss.shallow_clone(),
        })
    }

    /// Elements whose main params / state live on the host.
    pub fn offloaded_numel(&self) -> i64 {
        self.chunks()
            .filter(|c| c.offloaded)
            .map(|c| match &c.storage {
                Storage::Flat { main, .. } => main.numel() as i64,
                Storage::Aliased { .. } => 0,
            })
            .sum()
    }

    fn chunks(&self) -> impl Iterator<Item = &Chunk> {
        self.groups.iter().flat_map(|g| &g.chunks)
    }

    /// Releases every model grad (`zero_grad(set_to_none=True)`).
    pub fn zero_grad(&mut self) -> Result<()> {
        for g in &self.groups {
            for p in &g.params {
                ops::set_grad(&p.tensor, None)?;
            }
        }
        Ok(())
    }

    /// Main (fp32) param of a model param, by name: a view of the flat buffer, or the param.
    pub fn main_param(&self, name: &str) -> Option<Tensor> {
        self.main_params()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    /// Every main param with its model param's name.
    pub fn main_params(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for g in &self.groups {
            for c in &g.chunks {
                match &c.storage {
                    Storage::Flat { members, .. } => out.extend(
                        members
                            .iter()
                            .map(|m| (g.params[m.param].name.clone(), m.main.shallow_clone())),
                    ),
                    Storage::Aliased { members } => {
                        out.extend(members.iter().map(|&i| {
                            (g.params[i].name.clone(), g.params[i].tensor.shallow_clone())
                        }))
                    }
                }
            }
        }
        out
    }

    /// Copies the model params into the main params (after loading model weights).
    pub fn reload_model_params(&mut self) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for g in &self.groups {
                for c in &g.chunks {
                    if let Storage::Flat { members, .. } = &c.storage {
                        let dst: Vec<Tensor> =
                            members.iter().map(|m| m.main.shallow_clone()).collect();
                        let src: Vec<Tensor> = members
                            .iter()
                            .map(|m| g.params[m.param].tensor.detach())
                            .collect();
                        ops::foreach_copy(&dst, &src, false)?;
                    }
                }
            }
            Ok(())
        })
    }

    /// Megatron's step: prepare grads (copy, unscale, found-inf over `mp_group`, scaler
    /// update), grad norm over `mp_group`, clip, count zeros, inner step, copy back.
    /// `mp_group` is the model-parallel group (None: this rank alone).
    pub fn step(&mut self, mp_group: Option<&ProcessGroup>) -> Result<StepOutcome> {
        self.step_with_groups(mp_group, mp_group)
    }

    /// [`step`](Self::step) with found-inf reduced over `found_inf_group` and the grad norm
    /// (and zero count) over `norm_group`. Sharded data parallelism with replicas (FSDP's
    /// HYBRID_SHARD) needs both: every rank must agree on skipping, while the replicas'
    /// identical shards are counted once in the norm.
    pub fn step_with_groups(
        &mut self,
        found_inf_group: Option<&ProcessGroup>,
        norm_group: Option<&ProcessGroup>,
    ) -> Result<StepOutcome> {
        if self.prepare_grads(found_inf_group)? {
            return Ok(StepOutcome {
                update_successful: false,
                grad_norm: None,
                num_zeros: None,
            });
        }
        let grad_norm = self.grad_norm(NormType::L2, norm_group)?;
        if self.config.clip_grad > 0.0 {
            clip::clip_grad_by_total_norm_fp32(
                &self.main_grads(false),
                self.config.clip_grad,
                grad_norm,
            )?;
        }
        let num_zeros = if self.config.log_num_zeros_in_grad {
            Some(self.count_zeros(norm_group)?)
        } else {
            None
        };
        let skip = (self.config.grad_norm_skip_threshold.is_finite()
            && grad_norm > self.config.grad_norm_skip_threshold)
            || (self.config.skip_nonfinite_grad_norm && !grad_norm.is_finite());
        if !skip {
            self.step_with_ready_grads()?;
        }
        Ok(StepOutcome {
            update_successful: !skip,
            grad_norm: Some(grad_norm),
            num_zeros,
        })
    }

    /// Copies model grads into the flat main grads and, with a scaler, unscales them and
    /// checks for inf/nan (reduced with MAX over `mp_group`). Returns whether an overflow was
    /// found; the scaler has been updated either way.
    pub fn prepare_grads(&mut self, mp_group: Option<&ProcessGroup>) -> Result<bool> {
        self.copy_model_grads_to_main_grads()?;
        if self.scaler.is_none() {
            return Ok(false);
        }
        let grads = self.main_grads(false);
        match &mut self.scaler {
            Some(s) => s.unscale_and_check(&grads, mp_group),
            None => Ok(false),
        }
    }

    fn copy_model_grads_to_main_grads(&mut self) -> Result<()> {
        for g in &self.groups {
            for c in &g.chunks {
                let Storage::Flat { members, .. } = &c.storage else {
                    continue;
                };
                let mut dst = Vec::with_capacity(members.len());
                let mut src = Vec::with_capacity(members.len());
                for m in members {
                    let model_grad = g.params[m.param].tensor.grad();
                    if model_grad.defined() {
                        dst.push(m.grad.shallow_clone());
                        src.push(model_grad);
                    } else {
                        let _ = m.grad.shallow_clone().f_zero_()?;
                    }
                }
                ops::foreach_copy(&dst, &src, false)?;
                for m in members {
                    ops::set_grad(&g.params[m.param].tensor, None)?;
                }
            }
        }
        Ok(())
    }

    /// The main grads: flat grad buffers and the defined grads of aliased params
    /// (`for_norm`: only those counted in the norm).
    pub(crate) fn main_grads(&self, for_norm: bool) -> Vec<Tensor> {
        let mut out = Vec::new();
        for g in &self.groups {
            for c in &g.chunks {
                if for_norm && !c.in_norm {
                    continue;
                }
                match &c.storage {
                    Storage::Flat { grad, .. } => out.push(grad.shallow_clone()),
                    Storage::Aliased { members } => out.extend(
                        members
                            .iter()
                            .map(|&i| g.params[i].tensor.grad())
                            .filter(Tensor::defined),
                    ),
                }
            }
        }
        out
    }

    /// Global fp32 grad norm over the grads counted in the norm, reduced over `mp_group`
    /// (with [`Optimizer::set_local_params`], the L2 norm's squares of those parameters summed
    /// over their group first).
    pub fn grad_norm(&self, norm: NormType, mp_group: Option<&ProcessGroup>) -> Result<f64> {
        let Some(local) = self.local_params.as_ref().filter(|_| norm == NormType::L2) else {
            return clip::grad_norm_fp32(&self.main_grads(true), norm, mp_group);
        };
        let (shared, own) = self.main_grads_split(local.is_local);
        let sq = |grads: &[Tensor], group: Option<&ProcessGroup>| -> Result<f64> {
            Ok(clip::grad_norm_fp32(grads, NormType::L2, group)?.powi(2))
        };
        let total = sq(&shared, None)? + local.share * sq(&own, Some(&local.group))?;
        let t = Tensor::from_slice(&[total as f32]);
        if let Some(g) = mp_group {
            g.all_reduce(&t, crate::parallel::dist::ReduceOp::Sum)?;
        }
        Ok(f64::from(t.f_double_value(&[0])? as f32).sqrt())
    }

    /// Parameters whose name `is_local` are held by one rank of `group` each (the others
    /// hold the same copies of every other parameter): the grad norm counts each once. Their
    /// squares summed over `group` enter the model-parallel reduction times `share` (1, or
    /// `1/n` when `n` ranks of that reduction each hold the group's whole sum).
    pub fn set_local_params(
        &mut self,
        group: ProcessGroup,
        is_local: fn(&str) -> bool,
        share: f64,
    ) {
        self.local_params = Some(LocalParams {
            group,
            is_local,
            share,
        });
    }

    /// The grads counted in the norm, per parameter, split by `is_local` of its name:
    /// (the others, the local ones).
    fn main_grads_split(&self, is_local: fn(&str) -> bool) -> (Vec<Tensor>, Vec<Tensor>) {
        let (mut shared, mut own) = (Vec::new(), Vec::new());
        for g in &self.groups {
            for c in g.chunks.iter().filter(|c| c.in_norm) {
                let per_param: Vec<(usize, Tensor)> = match &c.storage {
                    Storage::Flat { members, .. } => members
                        .iter()
                        .map(|m| (m.param, m.grad.shallow_clone()))
                        .collect(),
                    Storage::Aliased { members } => members
                        .iter()
                        .map(|&i| (i, g.params[i].tensor.grad()))
                        .filter(|(_, t)| t.defined())
                        .collect(),
                };
                for (i, t) in per_param {
                    if is_local(&g.params[i].name) {
                        own.push(t);
                    } else {
                        shared.push(t);
                    }
                }
            }
        }
        (shared, own)
    }

    /// Zero elements in the grads counted in the norm, summed over `mp_group`.
    pub fn count_zeros(&self, mp_group: Option<&ProcessGroup>) -> Result<u64> {
        clip::count_zeros_fp32(&self.main_grads(true), mp_group)
    }

    /// Inner step of every chunk with its group's lr / weight decay, then copy back.
    pub fn step_with_ready_grads(&mut self) -> Result<()> {
        let cfg = self.config.inner;
        // bf16 params stepped in place follow torch's default AdamW op by op (see
        // `keep_param_dtype`); fp32 main params take the fused kernel.
        let rounding = if self.config.keep_param_dtype {
            inner::AdamRounding::PerOp
        } else {
            inner::AdamRounding::Fused
        };
        for (g, opts) in self.groups.iter_mut().zip(&self.options) {
            for c in &mut g.chunks {
                match &c.storage {
                    Storage::Flat { main, grad, .. } => {
                        let mut states: Vec<&mut SlotState> = c.slots.iter_mut().collect();
                        inner::step_slots(
                            &cfg,
                            std::slice::from_ref(main),
                            std::slice::from_ref(grad),
                            &mut states,
                            (opts.lr, opts.weight_decay),
                            rounding,
                        )?;
                    }
                    Storage::Aliased { members } => {
                        let mut params = Vec::new();
                        let mut grads = Vec::new();
                        let mut states = Vec::new();
                        for (slot, &i) in c.slots.iter_mut().zip(members) {
                            let gr = g.params[i].tensor.grad();
                            if !gr.defined() {
                                continue; // torch skips params without grads
                            }
                            params.push(g.params[i].tensor.detach());
                            grads.push(gr);
                            states.push(slot);
                        }
                        inner::step_slots(
                            &cfg,
                            &params,
                            &grads,
                            &mut states,
                            (opts.lr, opts.weight_decay),
                            rounding,
                        )?;
                    }
                }
            }
        }
        self.copy_main_params_to_model_params()
    }

    /// Bytes this optimizer owns: main copies (flat chunks) and their grads, and the inner
    /// optimizer's state (moments, momentum), as `(main_and_grads, state)`. Aliased params are
    /// the model's, not counted.
    pub fn owned_bytes(&self) -> (i64, i64) {
        let bytes = crate::ops::tensor_bytes;
        let (mut main_bytes, mut state) = (0i64, 0i64);
        for c in self.chunks() {
            if let Storage::Flat { main, grad, .. } = &c.storage {
                main_bytes += bytes(main) + bytes(grad);
            }
            for s in &c.slots {
                state += match s {
                    inner::SlotState::Adam {
                        exp_avg,
                        exp_avg_sq,
                        step,
                    } => bytes(exp_avg) + bytes(exp_avg_sq) + bytes(step),
                    inner::SlotState::Sgd {
                        momentum_buffer, ..
                    } => momentum_buffer.as_ref().map_or(0, bytes),
                };
            }
        }
        (main_bytes, state)
    }

    fn copy_main_params_to_model_params(&self) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for g in &self.groups {
                for c in &g.chunks {
                    let Storage::Flat { members, .. } = &c.storage else {
                        continue;
                    };
                    let dst: Vec<Tensor> = members
                        .iter()
                        .map(|m| g.params[m.param].tensor.detach())
                        .collect();
                    let src: Vec<Tensor> = members.iter().map(|m| m.main.shallow_clone()).collect();
                    ops::foreach_copy(&dst, &src, false)?;
                }
            }
            Ok(())
        })
    }
}
