//! [`MegatronEngine`]: the [`Engine`] interface over a [`MegatronModule`] (verl's
//! `MegatronEngine`): micro-batches through the pipeline schedules, the loss and the heads on
//! the last stage, the distributed (or replicated) optimizer, the lr schedule, checkpoints,
//! and full weights for the rollout.
//!
//! - Global-batch facts for the loss ([`AggOptions`]) are summed over the DP group, so every
//!   rank normalises by the whole batch; gradients are then averaged over DP.
//! - The last pipeline stage computes the head and the loss; its per-micro-batch metrics and
//!   its forward-only outputs are broadcast to the other stages, so every rank returns the same.
//! - No rank holds the whole model: the rollout generates from each rank's own shards
//!   ([`Engine::rollout_layout`] is [`RolloutLayout::Sharded`]; [`Engine::rollout_weights`]
//!   are the local parameters, or at another rollout TP size the rollout's shards cut from them
//!   by [`RolloutShards`]). Full weights exist only while [`Engine::per_tensor_params`]
//!   or a checkpoint gathers them, and, for a `builtin://` model, while the shards are cut
//!   from the seeded initialisation at start-up.
//! - Checkpoints: `huggingface/` (the full model, written by global rank 0, loadable by
//!   transformers and by any TP/PP layout) plus `optim/rank_{r}.safetensors` (each rank's
//!   optimizer pieces and the scheduler; reloadable with the same layout and DP size).
use std::path::{Path, PathBuf};

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::algo::AggOptions;
use crate::engine::hybrid::{RolloutLayout, ShardLayout};
use crate::engine::{
    Batch, Engine, EngineError, EngineSettings, ForwardOptions, Head, LossFn, Metrics,
    MicroBatching, SchedulerSettings, StepResult, global_agg_options, topk_targets,
};
use crate::logits::LogProbOutput;
use crate::logits::topk::topk_output;
use crate::model::init::{init_weights, init_weights_where};
use crate::model::moe::RouterLossCoeffs;
use crate::model::save::{SaveOptions, save_named};
use crate::model::vision::Vision;
use crate::model::{CausalLm, Dtype, ModelConfig, ModelSource, TorchKind, ValueModel};
use crate::optim::param_groups::{MegatronGroupsConfig, megatron_param_groups, single_group};
use crate::optim::stack;
use crate::optim::{NamedParam, Optimizer, ParamGroup};
use crate::parallel::dist::{ProcessGroup, ReduceOp};
use crate::parallel::layout::{ProcessGroups, RankLayout};
use crate::parallel::mappings::Tape;

use super::module::{MegatronModule, MicroBatch, MicroImages, ParallelSettings};
use super::offload::OffloadSlot;
use super::rollout_shards::{RolloutShards, cut_whole_experts};
use super::stage::{HeadKind, ParallelModel};
use super::{MegatronError, Result as MResult};
use crate::model::tensor_parallel::is_routed_expert_param;
use crate::ops::storage_bytes;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl From<MegatronError> for EngineError {
    fn from(e: MegatronError) -> Self {
        match e {
            MegatronError::Optim(o) => EngineError::Optim(o),
            MegatronError::Model(m) => EngineError::Model(m),
            MegatronError::Torch(t) => EngineError::Torch(t),
            other => EngineError::Config(other.to_string()),
        }
    }
}

/// A head the Megatron engine can run: how the last stage turns final hidden states into
/// the head's output, and how that output travels between stages.
pub trait MegatronHead: Head {
    const KIND: HeadKind;
    /// The head's output for a micro-batch (sequence tensors as in [`Head::forward`]).
    fn output(
        model: &ParallelModel,
        tape: &mut Tape,
        hidden: &Tensor,
        batch: &Batch,
        opts: &ForwardOptions,
    ) -> MResult<Self::Output>;
    /// The output as one f32 tensor `(planes, N, R)`.
    fn pack(out: &Self::Output) -> MResult<Tensor>;
    fn unpack(t: &Tensor, opts: &ForwardOptions) -> MResult<Self::Output>;
    /// Planes of [`pack`](Self::pack).
    fn planes(opts: &ForwardOptions) -> i64;
}

/// `(input_ids, response length)` of a batch in verl's layout.
fn response_len(batch: &Batch) -> MResult<i64> {
    let bad = |m: String| MegatronError::Config(m);
    let ids = batch.get("input_ids").map_err(|e| bad(e.to_string()))?;
    let r = batch
        .get("responses")
        .map_err(|e| bad(e.to_string()))?
        .size()
        .get(1)
        .copied()
        .unwrap_or(0);
    let t = ids.size().get(1).copied().unwrap_or(0);
    if r < 1 || r >= t {
        return Err(bad(format!(
            "responses of length {r} do not fit sequences of length {t}"
        )));
    }
    Ok(r)
}

impl MegatronHead for CausalLm {
    const KIND: HeadKind = HeadKind::CausalLm;

    fn output(
        model: &ParallelModel,
        tape: &mut Tape,
        hidden: &Tensor,
        batch: &Batch,
        opts: &ForwardOptions,
    ) -> MResult<LogProbOutput> {
        if opts.temperature.is_nan() || opts.temperature <= 0.0 {
            return Err(MegatronError::Config(format!(
                "temperature must be positive, got {}",
                opts.temperature
            )));
        }
        let r = response_len(batch)?;
        let ids = batch
            .get("input_ids")
            .map_err(|e| MegatronError::Config(e.to_string()))?;
        let t = ids.size()[1];
        let targets =
            topk_targets(batch, opts).map_err(|e| MegatronError::Config(e.to_string()))?;
        let out = model.next_token_log_probs(
            tape,
            hidden,
            ids,
            (t - r - 1, r),
            opts.temperature,
            opts.stats(),
            (opts.topk, targets.as_ref()),
        )?;
        Ok(LogProbOutput {
            log_probs: out.log_probs,
            entropy: out.entropy,
            sum_pi_squared: out.sum_pi_squared,
            topk: match out.topk {
                Some(columns) => topk_output(&columns, opts.topk)?,
                None => None,
            },
        })
    }

    fn pack(out: &LogProbOutput) -> MResult<Tensor> {
        let mut planes = vec![out.log_probs.detach()];
        planes.extend(out.entropy.as_ref().map(Tensor::detach));
        planes.extend(out.sum_pi_squared.as_ref().map(Tensor::detach));
        if let Some(topk) = &out.topk {
            planes.extend(topk.columns()?.detach().f_unbind(-1)?);
        }
        Ok(Tensor::f_stack(&planes, 0)?.f_to_kind(Kind::Float)?)
    }

    fn unpack(t: &Tensor, opts: &ForwardOptions) -> MResult<LogProbOutput> {
        let entropy = if opts.with_entropy {
            Some(t.f_get(1)?)
        } else {
            None
        };
        let sum_pi_squared = if opts.with_sum_pi_squared {
            Some(t.f_get(1 + i64::from(opts.with_entropy))?)
        } else {
            None
        };
        let stats = 1 + opts.stats().count();
        let columns = t
            .f_narrow(0, stats, opts.topk.columns())?
            .f_permute([1, 2, 0])?;
        Ok(LogProbOutput {
            log_probs: t.f_get(0)?,
            entropy,
            sum_pi_squared,
            topk: topk_output(&columns, opts.topk)?,
        })
    }

    fn planes(opts: &ForwardOptions) -> i64 {
        1 + opts.stats().count() + opts.topk.columns()
    }
}

impl MegatronHead for ValueModel {
    const KIND: HeadKind = HeadKind::Value;

    fn output(
        model: &ParallelModel,
        _tape: &mut Tape,
        hidden: &Tensor,
        batch: &Batch,
        _opts: &ForwardOptions,
    ) -> MResult<Tensor> {
        let r = response_len(batch)?;
        // The batch's length: hidden states may carry right padding (sequence parallelism).
        let t = batch
            .get("input_ids")
            .map_err(|e| MegatronError::Config(e.to_string()))?
            .size()[1];
        model.values_at(hidden, (t - r - 1, r))
    }

    fn pack(out: &Tensor) -> MResult<Tensor> {
        Ok(out.detach().f_unsqueeze(0)?.f_to_kind(Kind::Float)?)
    }

    fn unpack(t: &Tensor, _opts: &ForwardOptions) -> MResult<Tensor> {
        Ok(t.f_get(0)?)
    }

    fn planes(_opts: &ForwardOptions) -> i64 {
        1
    }
}

/// Which parameter groups the optimizer gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupPolicy {
    /// Megatron's standard groups: no weight decay for biases and 1-D params.
    #[default]
    Megatron,
    /// One group (what the single-process engine does), for comparisons with it.
    Single,
}

/// What a [`MegatronEngine`] is built from beyond the strategy-neutral [`EngineSettings`].
#[derive(Debug, Clone, Default)]
pub struct MegatronSettings {
    /// The TP/PP/DP groups (`None`: one process).
    pub groups: Option<ProcessGroups>,
    pub parallel: ParallelSettings,
    pub param_groups: GroupPolicy,
    /// Megatron's sequence parallelism (with TP > 1).
    pub sequence_parallel: bool,
    /// verl's `megatron.param_offload`: parameters in host memory between phases.
    pub param_offload: bool,
    /// verl's `megatron.grad_offload`: gradient buffers in host memory between phases.
    pub grad_offload: bool,
    /// `expert_model_parallel_size`: the experts of a mixture-of-experts model split over that
    /// many data-parallel ranks (the engine builds the groups once it knows the model has
    /// experts; a dense model ignores it, as Megatron does).
    pub expert_parallel: usize,
    /// `expert_tensor_parallel_size`: whether each expert is split over the tensor-parallel
    /// group (`true`: Megatron's default, ETP = TP) or whole on every rank (ETP 1; `verlc
    /// build` refuses any other size).
    pub experts_split_over_tp: bool,
    /// What Megatron's router adds: its losses' coefficients and its dtype.
    pub router: verlc_spec::trainer::RouterSpec,
}

impl MegatronSettings {
    /// The settings of a role's Megatron engine spec over `world` (`None`: one process): TP
    /// and PP from the spec, DP from the rest, in Megatron's rank order. What the engine does
    /// not implement (context, expert and virtual-pipeline parallelism, model offload on an
    /// accelerator) is refused by `verlc build` and never reaches it; the optimizer's offload is
    /// in the role's [`EngineSettings`].
    pub fn from_spec(
        world: Option<&ProcessGroup>,
        spec: &verlc_spec::trainer::MegatronEngineSpec,
    ) -> Result<Self> {
        let bad = |m: String| EngineError::Config(m);
        let (tp, pp) = (spec.tensor_parallel.max(1), spec.pipeline_parallel.max(1));
        let cp = spec.context_parallel.max(1);
        let world_size = world.map_or(1, ProcessGroup::size);
        let model_parallel = tp.checked_mul(pp).and_then(|n| n.checked_mul(cp));
        if model_parallel.is_none_or(|mp| !world_size.is_multiple_of(mp)) {
            return Err(bad(format!(
                "{world_size} ranks cannot hold tensor parallel {tp} × context parallel {cp} × \
                 pipeline parallel {pp}"
            )));
        }
        let mp = model_parallel.unwrap_or(1);
        let groups = match world {
            Some(w) => {
                let layout = RankLayout::megatron(tp, cp, pp, world_size / mp)
                    .map_err(MegatronError::from)?;
                Some(ProcessGroups::new(w, &layout).map_err(MegatronError::from)?)
            }
            None if mp > 1 => {
                return Err(bad(format!(
                    "tensor parallel {tp} × context parallel {cp} × pipeline parallel {pp} \
                     needs {mp} ranks"
                )));
            }
            None => None,
        };
        Ok(MegatronSettings {
            groups,
            parallel: ParallelSettings {
                use_distributed_optimizer: spec.use_distributed_optimizer,
                layout: Default::default(),
            },
            param_groups: GroupPolicy::Megatron,
            sequence_parallel: spec.sequence_parallel && tp > 1,
            param_offload: spec.param_offload,
            grad_offload: spec.grad_offload,
            expert_parallel: spec.expert_parallel.max(1),
            experts_split_over_tp: spec.expert_tensor_parallel.is_none_or(|e| e == tp) || tp == 1,
            router: spec.router,
        })
    }
}

const OPTIM_DIR: &str = "optim";

/// transformers' default `router_aux_loss_coef` for Qwen MoE configs that leave it out.
const DEFAULT_ROUTER_AUX_LOSS_COEF: f64 = 0.001;

/// The Megatron engine; see the module docs.
pub struct MegatronEngine<H: MegatronHead> {
    module: MegatronModule,
    config: ModelConfig,
    settings: EngineSettings,
    /// Parameter and gradient offload (see [`super::offload`]): every engine call that needs
    /// them brings them back first and parks them again when its phase ends (parameters after
    /// each call, gradients after the optimizer step).
    offload_params: OffloadSlot,
    offload_grads: OffloadSlot,
    /// The rollout's layout when its TP size is not training's ([`Engine::rollout_layout`]).
    rollout: Option<RolloutShards>,
    head: std::marker::PhantomData<H>,
}

/// Bytes of the offloadable tensors on the device and parked in host memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Residency {
    /// Parameters (and the distributed optimizer's param buffer) in device storage.
    pub device_params: usize,
    /// Gradients (and the distributed optimizer's grad buffers) in device storage.
    pub device_grads: usize,
    /// Parked in host memory.
    pub host: usize,
}

impl<H: MegatronHead> std::fmt::Debug for MegatronEngine<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MegatronEngine")
            .field("module", &self.module)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<H: MegatronHead> MegatronEngine<H> {
    /// Builds this rank's part of the model (loaded sharded from its checkpoint, or a
    /// `builtin://` model initialised from `seed` exactly as the single-process engine does),
    /// its optimizer and scheduler (unless forward-only).
    pub fn new(settings: EngineSettings, megatron: MegatronSettings) -> Result<Self> {
        let path = &settings.model_path;
        let source = ModelSource::parse(path)?;
        let config = settings.model_config(&source)?;
        let kind = settings.param_dtype.kind();
        // A mixture-of-experts model with expert parallelism, or with whole experts under
        // tensor parallelism, gets the expert groups (collective over the world; every rank
        // loads the same config).
        let whole = !megatron.experts_split_over_tp;
        let groups = match &megatron.groups {
            Some(g) if (megatron.expert_parallel > 1 || whole) && config.moe.num_experts > 0 => {
                Some(
                    ProcessGroups::with_experts(
                        &g.world,
                        &g.layout,
                        megatron.expert_parallel,
                        !whole,
                    )
                    .map_err(MegatronError::from)?,
                )
            }
            other => other.clone(),
        };
        let mut module = MegatronModule::with_sequence_parallel(
            &config,
            H::KIND,
            groups,
            settings.device,
            kind,
            megatron.sequence_parallel,
        )?;
        // Megatron's bridge takes the load-balancing coefficient from the model's config.
        let r = &megatron.router;
        let model_coeff = config
            .extra
            .get("router_aux_loss_coef")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(DEFAULT_ROUTER_AUX_LOSS_COEF);
        let coeffs = RouterLossCoeffs {
            load_balancing: if r.load_balancing {
                r.load_balancing_coeff.unwrap_or(model_coeff)
            } else {
                0.0
            },
            z: r.z_loss_coeff,
        };
        module.model.set_router(coeffs, r.fp32);
        match &source {
            ModelSource::Builtin(_) => {
                // Initialised from the seed on the whole model, as the single engine does, so
                // every layout starts from the same weights; the whole model lives only until
                // the shards are cut from it.
                let mut full_vs = VarStore::new(settings.device);
                let _full = H::build(&config, full_vs.root())
                    .map_err(|msg| EngineError::Config(format!("model `{path}`: {msg}")))?;
                full_vs.set_kind(kind);
                init_weights(&full_vs, &config, settings.seed)?;
                let named: Vec<(String, Tensor)> = full_vs.variables().into_iter().collect();
                module.load_full(&named)?;
            }
            ModelSource::Dir(dir) => {
                let report = module.load_pretrained(dir, &H::fresh_prefixes())?;
                let fresh = report.missing;
                // Fresh (value-head) params are replicated, and the init is seeded by name.
                init_weights_where(&module.vs, &config, settings.seed, |n| {
                    fresh.iter().any(|m| m == n)
                })?;
            }
        }
        match &settings.optim {
            None => module.vs.freeze(),
            Some(o) => {
                // Megatron keeps fp32 main params (its optimizers' design); lowering gives
                // no other main dtype to a Megatron role.
                if settings.main_dtype != Dtype::Fp32 {
                    return Err(EngineError::Config(format!(
                        "the Megatron engine keeps fp32 main params, not {}",
                        settings.main_dtype.name()
                    )));
                }
                let cfg = stack::optimizer_config(o, settings.param_dtype, Dtype::Fp32)?;
                let (lr, wd) = (o.lr, o.weight_decay);
                let min_lr = match o.schedule {
                    SchedulerSettings::Megatron(c) => c.min_lr,
                    SchedulerSettings::Verl(_) => 0.0,
                };
                let policy = megatron.param_groups;
                let make = move |params: Vec<NamedParam>| -> Vec<ParamGroup> {
                    match policy {
                        GroupPolicy::Single => single_group(params, lr, wd),
                        GroupPolicy::Megatron => megatron_param_groups(
                            params,
                            &MegatronGroupsConfig {
                                lr,
                                min_lr,
                                weight_decay: wd,
                                decoupled_lr: None,
                                decoupled_min_lr: None,
                                apply_wd_to_qk_layernorm: false,
                            },
                        ),
                    }
                };
                module.build_optimizer(cfg, make, megatron.parallel, settings.loss_scaling)?;
                let opt = module
                    .inner_optimizer_mut()
                    .ok_or_else(|| EngineError::Config("the optimizer was not built".into()))?;
                stack::with_schedule(opt, &o.schedule)?;
            }
        }
        let engine = MegatronEngine {
            module,
            config,
            settings,
            offload_params: OffloadSlot::new(megatron.param_offload),
            offload_grads: OffloadSlot::new(megatron.grad_offload),
            rollout: None,
            head: std::marker::PhantomData,
        };
        engine.park_params()?;
        engine.park_grads()?;
        Ok(engine)
    }

    pub fn megatron_module(&self) -> &MegatronModule {
        &self.module
    }

    /// Where the offloadable tensors are now.
    pub fn residency(&self) -> Residency {
        let sum = |ts: Vec<Tensor>| ts.iter().map(storage_bytes).sum();
        Residency {
            device_params: sum(self.module.offloadable_params()),
            device_grads: sum(self.module.offloadable_grads()),
            host: self.offload_params.host_bytes() + self.offload_grads.host_bytes(),
        }
    }

    /// Moves the parameters to host memory (with `param_offload`; no-op when parked).
    fn park_params(&self) -> Result<()> {
        Ok(self
            .offload_params
            .park(|| self.module.offloadable_params())?)
    }

    /// Moves the gradient buffers to host memory (with `grad_offload`; no-op when parked).
    fn park_grads(&self) -> Result<()> {
        Ok(self
            .offload_grads
            .park(|| self.module.offloadable_grads())?)
    }

    fn bring_params(&self) -> Result<()> {
        Ok(self.offload_params.bring()?)
    }

    fn bring_grads(&self) -> Result<()> {
        Ok(self.offload_grads.bring()?)
    }

    /// [`Engine::infer_batch`] with the parameters on the device.
    fn infer_resident(
        &mut self,
        batch: &Batch,
        micro: &MicroBatching,
        fwd: &ForwardOptions,
    ) -> Result<Vec<H::Output>> {
        let (parts, mbs) = Self::micro_batches(batch, micro)?;
        let planes = H::planes(fwd);
        let shapes: Vec<Vec<i64>> = parts
            .iter()
            .map(|p| Ok(vec![planes, p.rows(), response_len(p)?]))
            .collect::<MResult<_>>()?;
        let mut head = |mb: usize,
                        model: &ParallelModel,
                        tape: &mut Tape,
                        hidden: &Tensor|
         -> MResult<Tensor> {
            let part = parts
                .get(mb)
                .ok_or_else(|| MegatronError::Config(format!("no micro-batch {mb}")))?;
            H::pack(&H::output(model, tape, hidden, part, fwd)?)
        };
        let shape_of = |mb: usize| shapes.get(mb).cloned().unwrap_or_default();
        let packed = self.module.forward_only(&mbs, &shape_of, &mut head)?;
        packed.iter().map(|t| Ok(H::unpack(t, fwd)?)).collect()
    }

    /// [`Engine::save_checkpoint`] with the parameters on the device.
    fn save_resident(&self, dir: &Path) -> Result<()> {
        // Collective: every rank takes part in gathering the full weights.
        let full = self.module.full_params()?;
        if self.world_rank() == 0 {
            std::fs::create_dir_all(dir).map_err(|e| Self::ck(dir, e))?;
            let arch = H::architecture(&self.config).map_err(|e| Self::ck(dir, e))?;
            save_named(
                &full,
                &self.config,
                arch,
                &dir.join(crate::engine::HF_DIR),
                &SaveOptions::default(),
            )?;
        }
        if self.module.inner_optimizer().is_some() {
            let file = self.optim_file(dir);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Self::ck(parent, e))?;
            }
            self.module.save_optimizer(&file)?;
        }
        self.barrier()
    }

    /// [`Engine::load_checkpoint`] with the parameters on the device.
    fn load_resident(&mut self, dir: &Path) -> Result<()> {
        let hf = dir.join(crate::engine::HF_DIR);
        self.module.load_pretrained(&hf, &[])?;
        if self.module.inner_optimizer().is_some() {
            let path = self.optim_file(dir);
            if !path.is_file() {
                return Err(Self::ck(
                    &path,
                    "missing (the checkpoint has no optimizer state for this rank)",
                ));
            }
            self.module.load_optimizer(&path)?;
        }
        Ok(())
    }

    /// Runs `f` with the parameters on the device, parking them again afterwards.
    fn with_params<T>(&self, f: impl FnOnce(&Self) -> Result<T>) -> Result<T> {
        self.bring_params()?;
        let out = f(self)?;
        self.park_params()?;
        Ok(out)
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.config
    }

    fn groups(&self) -> Option<&ProcessGroups> {
        self.module.groups()
    }

    fn pp(&self) -> Option<&ProcessGroup> {
        self.groups().map(|g| &g.pp).filter(|g| g.size() > 1)
    }

    /// The global-batch normalisation: this rank's counts summed over DP.
    fn agg_options(&self, batch: &Batch) -> Result<AggOptions> {
        let local = global_agg_options(batch, self.dp_size(), self.settings.loss_scale_factor)?;
        let Some(dp) = self.groups().map(|g| &g.dp).filter(|g| g.size() > 1) else {
            return Ok(local);
        };
        let counts = Tensor::from_slice(&[
            local.batch_num_tokens.unwrap_or(0.0),
            local.global_batch_size.unwrap_or(0.0),
        ]);
        dp.all_reduce(&counts, ReduceOp::Sum)
            .map_err(MegatronError::from)?;
        let (tokens, seqs) = (counts.f_double_value(&[0])?, counts.f_double_value(&[1])?);
        Ok(AggOptions {
            batch_num_tokens: (tokens > 0.0).then_some(tokens),
            global_batch_size: (seqs > 0.0).then_some(seqs),
            ..local
        })
    }

    /// The router losses' means over the model's mixture-of-experts layers and the
    /// micro-batches, without coefficients (`{role}/moe_load_balancing_loss`,
    /// `{role}/moe_z_loss`, for those with a coefficient), into every micro-batch's metrics
    /// (which the workers average). Collective over the context-parallel group (each rank has
    /// its share of every value) and the pipeline (each stage its layers).
    fn add_router_metrics(&self, metrics: &mut [Metrics]) -> Result<()> {
        let Some(coeffs) = self.module.model.router_losses() else {
            return Ok(());
        };
        let values = self.module.router_values();
        let sums = Tensor::from_slice(&[
            values.iter().map(|v| v[0]).sum::<f64>(),
            values.iter().map(|v| v[1]).sum::<f64>(),
        ]);
        if let Some(cp) = self.groups().and_then(|g| g.cp.as_ref()) {
            cp.all_reduce(&sums, ReduceOp::Sum)
                .map_err(MegatronError::from)?;
        }
        let totals = Tensor::cat(&[sums, Tensor::from_slice(&[values.len() as f64])], 0);
        if let Some(pp) = self.pp() {
            pp.all_reduce(&totals, ReduceOp::Sum)
                .map_err(MegatronError::from)?;
        }
        let t = Vec::<f64>::try_from(&totals)
            .map_err(|e| EngineError::Config(format!("router metrics: {e}")))?;
        let n = t.get(2).copied().unwrap_or(0.0).max(1.0);
        let role = H::KIND.metric_role();
        for m in metrics.iter_mut() {
            if coeffs.load_balancing != 0.0 {
                m.insert(format!("{role}/moe_load_balancing_loss"), t[0] / n);
            }
            if coeffs.z != 0.0 {
                m.insert(format!("{role}/moe_z_loss"), t[1] / n);
            }
        }
        Ok(())
    }

    /// Sends the last stage's metrics to every stage of the pipeline.
    fn broadcast_metrics(&self, metrics: Vec<Metrics>) -> Result<Vec<Metrics>> {
        let Some(pp) = self.pp() else {
            return Ok(metrics);
        };
        let last = pp.size() - 1;
        let bytes = if pp.rank() == last {
            serde_json::to_vec(&metrics)
                .map_err(|e| EngineError::Config(format!("metrics: {e}")))?
        } else {
            Vec::new()
        };
        let len = Tensor::from_slice(&[bytes.len() as i64]);
        pp.broadcast(&len, last).map_err(MegatronError::from)?;
        let n = len.f_int64_value(&[0])?;
        let buf = if pp.rank() == last {
            Tensor::from_slice(&bytes)
        } else {
            Tensor::f_zeros([n], (Kind::Uint8, Device::Cpu))?
        };
        pp.broadcast(&buf, last).map_err(MegatronError::from)?;
        let len = usize::try_from(n).unwrap_or(0);
        let mut out = vec![0u8; len];
        buf.f_copy_data_u8(&mut out, len)?;
        serde_json::from_slice(&out).map_err(|e| EngineError::Config(format!("metrics: {e}")))
    }

    fn micro_batches(
        batch: &Batch,
        micro: &MicroBatching,
    ) -> Result<(Vec<Batch>, Vec<MicroBatch>)> {
        let parts = micro.cut_rows(batch)?;
        let mbs = parts
            .iter()
            .map(|b| {
                let input_ids = b.get("input_ids")?.shallow_clone();
                let images = if b.images().is_empty() {
                    None
                } else {
                    let (t, r) = crate::engine::lengths(b)?;
                    let items = b.all_images();
                    let (pixels, grids) = Vision::pixels(&items, input_ids.device())?;
                    Some(MicroImages {
                        pixels,
                        grids,
                        videos: Vision::video_flags(&items),
                        prompt_width: t - r,
                    })
                };
                Ok(MicroBatch {
                    input_ids,
                    position_ids: b.get("position_ids")?.shallow_clone(),
                    attention_mask: Some(b.get("attention_mask")?.shallow_clone()),
                    images,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((parts, mbs))
    }

    fn ck(path: &Path, msg: impl std::fmt::Display) -> EngineError {
        EngineError::Checkpoint {
            path: path.to_path_buf(),
            msg: msg.to_string(),
        }
    }

    fn world_rank(&self) -> usize {
        self.groups().map_or(0, |g| g.world.rank())
    }

    fn optim_file(&self, dir: &Path) -> PathBuf {
        dir.join(OPTIM_DIR)
            .join(format!("rank_{}.safetensors", self.world_rank()))
    }

    fn barrier(&self) -> Result<()> {
        if let Some(g) = self.groups() {
            g.world.barrier().map_err(MegatronError::from)?;
        }
        Ok(())
    }
}

impl<H: MegatronHead> Engine for MegatronEngine<H> {
    type Head = H;

    fn model_config(&self) -> &ModelConfig {
        &self.config
    }

    fn set_adapters_enabled(&self, _: bool) -> Result<()> {
        Err(EngineError::Config(
            "the Megatron engine has no LoRA adapters".into(),
        ))
    }

    fn forward_backward(
        &mut self,
        batch: &Batch,
        micro: &MicroBatching,
        fwd: &ForwardOptions,
        loss: &mut LossFn<'_, H::Output>,
    ) -> Result<Vec<Metrics>> {
        if self.module.inner_optimizer().is_none() {
            return Err(EngineError::Config(
                "this engine is forward-only (no optimizer)".into(),
            ));
        }
        self.bring_params()?;
        self.bring_grads()?;
        let agg = self.agg_options(batch)?;
        let (parts, mbs) = Self::micro_batches(batch, micro)?;
        let mut metrics = Vec::with_capacity(parts.len());
        let mut failure: Option<EngineError> = None;
        {
            let mut head = |mb: usize,
                            model: &ParallelModel,
                            tape: &mut Tape,
                            hidden: &Tensor|
             -> MResult<Tensor> {
                let part = parts
                    .get(mb)
                    .ok_or_else(|| MegatronError::Config(format!("no micro-batch {mb}")))?;
                let out = H::output(model, tape, hidden, part, fwd)?;
                match loss(part, out, &agg) {
                    Ok(micro) => {
                        metrics.push(micro.metrics);
                        Ok(micro.loss)
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        failure = Some(e);
                        Err(MegatronError::Config(msg))
                    }
                }
            };
            if let Err(e) = self.module.forward_backward(&mbs, &mut head) {
                return Err(failure.take().unwrap_or_else(|| e.into()));
            }
        }
        self.add_router_metrics(&mut metrics)?;
        self.broadcast_metrics(metrics)
    }

    fn infer_batch(
        &mut self,
        batch: &Batch,
        micro: &MicroBatching,
        fwd: &ForwardOptions,
    ) -> Result<Vec<H::Output>> {
        self.bring_params()?;
        let out = self.infer_resident(batch, micro, fwd);
        self.park_params()?;
        out
    }

    fn optimizer_zero_grad(&mut self) -> Result<()> {
        self.bring_grads()?;
        Ok(self.module.zero_grad()?)
    }

    fn optimizer_step(&mut self) -> Result<StepResult> {
        self.bring_params()?;
        self.bring_grads()?;
        let outcome = self.module.step()?;
        // The update phase ends here.
        self.park_params()?;
        self.park_grads()?;
        Ok(StepResult {
            grad_norm: outcome.grad_norm,
            update_successful: outcome.update_successful,
        })
    }

    fn lr_scheduler_step(&mut self) -> Result<f64> {
        let opt = self.module.inner_optimizer_mut().ok_or_else(|| {
            EngineError::Config("this engine is forward-only (no optimizer)".into())
        })?;
        Ok(opt.scheduler_step(1))
    }

    fn lr(&self) -> f64 {
        self.module.inner_optimizer().map_or(0.0, Optimizer::lr)
    }

    fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        // The optimizer's fp32 main params may be views of the (parked) param buffer.
        self.with_params(|e| e.save_resident(dir))
    }

    fn load_checkpoint(&mut self, dir: &Path) -> Result<()> {
        self.bring_params()?;
        self.load_resident(dir)?;
        self.park_params()
    }

    fn per_tensor_params(&self) -> Result<Vec<(String, Tensor)>> {
        self.with_params(|e| Ok(e.module.full_params()?))
    }

    fn load_params(&mut self, named: &[(String, Tensor)]) -> Result<()> {
        self.bring_params()?;
        self.module.load_full(named)?;
        self.park_params()?;
        Ok(())
    }

    /// This rank's stage at the rollout's TP size: training's groups, or (another size) the
    /// groups of [`RolloutShards`], built here.
    fn rollout_layout(&mut self, tensor_parallel: Option<usize>) -> Result<RolloutLayout> {
        let active = |g: &ProcessGroup| (g.size() > 1).then(|| g.clone());
        let train_tp = self.groups().map_or(1, |g| g.tp.size());
        self.rollout = match tensor_parallel.filter(|&r| r != train_tp) {
            None => None,
            Some(r) => {
                let groups = self.groups().ok_or_else(|| {
                    EngineError::Config(format!(
                        "a rollout tensor parallel size of {r} needs {r} ranks; this run has one"
                    ))
                })?;
                Some(RolloutShards::new(groups, r)?)
            }
        };
        let (tp, share) = match &self.rollout {
            Some(shards) => (active(&shards.tp), Some(shards.share.clone())),
            None => (self.groups().and_then(|g| active(&g.tp)), None),
        };
        Ok(RolloutLayout::Sharded(ShardLayout {
            config: self.config.clone(),
            stage: self.module.model.stage.clone(),
            tp,
            pp: self.groups().and_then(|g| active(&g.pp)),
            share,
        }))
    }

    /// This rank's parameters (its stage's layers, its tensor-parallel slices): the live
    /// tensors, or with `param_offload` a device copy the rollout holds while it generates
    /// (what verl's rollout engine gets) while the parameters go back to host memory. At
    /// another rollout TP size, the rollout's shards cut from them ([`RolloutShards`]).
    fn rollout_weights(&self) -> Result<Vec<(String, Tensor)>> {
        let copy = self.offload_params.is_on();
        if let Some(shards) = &self.rollout {
            return self.with_params(|e| {
                let model = &e.module.model;
                if model.experts_split_over_tp() {
                    return Ok(shards.reshard(model.params(), model.tp(), &e.config, copy)?);
                }
                // Whole experts: every expert (the others' from their ranks) cut to this
                // rank's rollout shard; the rest resharded from the training shards.
                let (experts, rest): (Vec<_>, Vec<_>) = model
                    .params()
                    .into_iter()
                    .partition(|p| is_routed_expert_param(&p.name));
                let mut out = shards.reshard(rest, model.tp(), &e.config, copy)?;
                let own = experts.into_iter().map(|p| (p.name, p.tensor)).collect();
                let all = e.module.with_all_experts(own)?;
                out.extend(cut_whole_experts(all, &e.config, &shards.tp, copy)?);
                Ok(out)
            });
        }
        self.with_params(|e| {
            let own: Vec<(String, Tensor)> = e
                .module
                .model
                .params()
                .into_iter()
                .map(|p| {
                    let t = if copy {
                        p.tensor.f_detach_copy()?
                    } else {
                        p.tensor.detach()
                    };
                    Ok((p.name, t))
                })
                .collect::<Result<_>>()?;
            // The rollout model holds every expert, split over TP like a dense MLP: the
            // others' come from their ranks, whole ones are cut to this rank's slice (`own`
            // is a copy already where one is needed).
            let all = e.module.with_all_experts(own)?;
            let model = &e.module.model;
            match model.tp().filter(|_| !model.experts_split_over_tp()) {
                Some(tp) => Ok(cut_whole_experts(all, &e.config, tp, false)?),
                None => Ok(all),
            }
        })
    }

    fn dp_size(&self) -> usize {
        self.module.dp_rank_size().1
    }

    fn dp_rank(&self) -> usize {
        self.module.dp_rank_size().0
    }

    fn max_over_ranks(&self, n: usize) -> Result<usize> {
        let Some(g) = self.groups() else {
            return Ok(n);
        };
        let t = Tensor::from_slice(&[n as i64]);
        g.world
            .all_reduce(&t, crate::parallel::dist::ReduceOp::Max)
            .map_err(MegatronError::from)?;
        Ok(usize::try_from(t.f_int64_value(&[0])?).unwrap_or(n))
    }
}
