//! [`FsdpEngine`]: fully sharded data parallel (verl's FSDP engine; docs/parallelism.md) on
//! c10d.
//!
//! The model is split into flat-parameter units ([`FlatUnit`]): one per decoder layer and a
//! root unit (embeddings, final norm, head). Each rank keeps a 1/N shard of every unit;
//! the optimizer ([`crate::optim::Optimizer`]; the shards are its main params, stepped in
//! place) steps only the shards, with the grad norm reduced over the group.
//!
//! tch has no module hooks and no custom autograd functions, so the engine runs the model unit
//! by unit:
//! - forward: gather the root, embed, then for each layer gather → forward (no grad) → free
//!   (`reshard_after_forward`), keeping only the boundary activations; the head's forward runs
//!   with grad from the last boundary;
//! - backward: the loss is back-propagated to the last boundary; then, for each layer in
//!   reverse, gather → recompute its forward from the saved boundary → back-propagate the
//!   boundary gradient → reduce-scatter the unit's gradient (in `reduce_dtype`, summed) into
//!   its shard's `.grad` → free; last, the embedding.
//!
//! Gradients are pre-divided rather than averaged (PyTorch FSDP's gradient pre-divide, taken
//! all the way): the loss, which verl's aggregation scales by the data-parallel size for an
//! averaging reduction, is divided by that size before backward, and the reductions (shard
//! group, then replicas) sum. The gradient is the same (exactly so for power-of-two sizes),
//! but each rank's backward sees only its rows' share of the global loss, as one process
//! running all the rows would, so fp16's headroom under the loss scale does not shrink as
//! ranks are added.
//!
//! This is also activation checkpointing per decoder layer: only the boundary activations of
//! a micro-batch live between forward and backward. Without `gradient_checkpointing` the
//! forward keeps each layer's autograd graph (and its gathered parameters) instead, and the
//! backward runs those graphs: no recomputation.
//!
//! Mixed precision: the shards are the main params, fp32 unless the engine's `main_dtype` is
//! bf16 (verl's `model_dtype: bf16`: bf16 shards and bf16 optimizer state under bf16 compute);
//! parameters are gathered in the engine's param dtype; gradients are reduced in
//! `reduce_dtype` (fp32 unless `mixed_precision.reduce_dtype` says otherwise) and accumulated
//! in the shards' dtype in their `.grad`.
//! fp16 adds dynamic loss scaling (PyTorch's `ShardedGradScaler`, with the optimizer's
//! Megatron scaler, [`ScalerConfig::megatron_dynamic`], as the single engine): the loss is
//! multiplied by the scale before backward; the optimizer unscales the shard gradients,
//! checks *its own shards* for inf/nan and all-reduces the flag (MAX) over every data-parallel
//! rank (the shard group and, with HYBRID_SHARD, the replicas), so every rank skips the same
//! steps and grows or backs off the scale identically; the grad norm is reduced over the
//! shard group (the whole sharded gradient, once). The scaler's state is part of each rank's
//! optimizer checkpoint.
//!
//! Offload: `param_offload` keeps the shards (and their grads) in host memory, gathered to the
//! device per unit; `optimizer_offload` keeps the optimizer's main copy and state on the host.

pub mod ckpt;
pub mod head;
mod layout;
pub mod unit;

use std::path::Path;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::model::load::{Checkpoint, LoadOptions, load_weights};
use crate::model::lora::{is_adapter, load_adapter};
use crate::model::pretrained::materialize;
use crate::model::vision::InputEmbeds;
use crate::model::{Dtype, ModelConfig, ModelSource, TorchKind};
use crate::optim::Optimizer;
use crate::optim::param_groups::{NamedParam, single_group};
use crate::optim::stack;
use crate::parallel::dist::{DistError, ProcessGroup, ReduceOp};

use super::{
    ADAPTER_DIR, Batch, Engine, EngineError, EngineSettings, ForwardOptions, HF_DIR, LossFn,
    Metrics, MicroBatching, Result, StepResult, global_agg_options, save_model,
};

pub use head::FsdpHead;
use layout::LayerInputs;
pub use unit::{FlatUnit, ShardPlace, UnitSet};

/// Errors of the FSDP machinery (collectives, sharding).
#[derive(Debug, thiserror::Error)]
pub enum FsdpError {
    #[error("FSDP: {0}")]
    Config(String),
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error(transparent)]
    Op(#[from] crate::ops::OpError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// A micro-batch's forward as the backward needs it ([`FsdpEngine::forward_boundaries`]).
struct Boundaries {
    saved: Vec<Tensor>,
    outputs: Vec<Tensor>,
    inputs: LayerInputs,
}

/// What an [`FsdpEngine`] is built from: the single engine's settings plus FSDP's own
/// (`fsdp_config`).
#[derive(Debug, Clone, PartialEq)]
pub struct FsdpSettings {
    pub engine: EngineSettings,
    /// dtype gradients are reduce-scattered in (`mixed_precision.reduce_dtype`, fp32).
    pub reduce_dtype: Kind,
    /// Keep the parameter shards (and their gradients) in host memory (`param_offload`).
    pub param_offload: bool,
    /// Free a layer's full parameters after its forward and gather again for the backward
    /// (FSDP's `reshard_after_forward`); false keeps them from forward to backward.
    pub reshard_after_forward: bool,
    /// Recompute each layer's forward in backward, keeping only the layer boundaries between
    /// forward and backward (the model's `enable_gradient_checkpointing`). Off, each layer's
    /// activations and its gathered parameters stay until its backward: a quarter less
    /// compute per update, for the activations and full parameters of every layer at once.
    pub gradient_checkpointing: bool,
    /// Ulysses sequence-parallel degree (`ulysses_sequence_parallel_size`): each micro-batch's
    /// packed tokens are split over this many consecutive ranks, which see the same rows; the
    /// data-parallel size is the world over it. Above 1 needs `engine.remove_padding`.
    pub ulysses: usize,
}

impl FsdpSettings {
    pub fn new(engine: EngineSettings) -> Self {
        FsdpSettings {
            engine,
            reduce_dtype: Kind::Float,
            param_offload: false,
            reshard_after_forward: true,
            gradient_checkpointing: true,
            ulysses: 1,
        }
    }

    /// The settings of a role's FSDP engine spec on top of `engine`, and its `fsdp_size` (for
    /// [`FsdpEngine::with_mesh`]). The optimizer's offload is already in `engine.optim`.
    pub fn from_spec(
        engine: EngineSettings,
        spec: &verlc_spec::trainer::FsdpEngineSpec,
    ) -> (Self, i64) {
        let settings = FsdpSettings {
            reduce_dtype: spec.reduce_dtype.kind(),
            engine,
            param_offload: spec.param_offload,
            reshard_after_forward: spec.reshard_after_forward,
            gradient_checkpointing: spec.gradient_checkpointing,
            ulysses: spec.ulysses.max(1),
        };
        (settings, spec.fsdp_size)
    }
}

/// Bytes this rank owns for the model's state (what ZeRO-3 shards), and the peak of the
/// transient full parameters gathered at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryReport {
    /// Parameter shards (in the main dtype).
    pub params: i64,
    /// Gradient shards (in the main dtype; 0 when released).
    pub grads: i64,
    /// Optimizer main copies (offload) and state.
    pub optimizer: i64,
    /// Peak bytes of gathered (full) units alive at the same time.
    pub peak_gathered: i64,
}

impl MemoryReport {
    pub fn sharded_total(&self) -> i64 {
        self.params + self.grads + self.optimizer
    }
}

/// The FSDP engine; see the module docs.
pub struct FsdpEngine<H: FsdpHead> {
    _vs: VarStore,
    module: H,
    config: ModelConfig,
    /// The root's units: embeddings, final norm and head, and a vision-language model's
    /// tower apart (frozen on its own under `freeze_vision_tower`).
    root: UnitSet,
    layers: Vec<UnitSet>,
    /// The group parameters are sharded over (FULL_SHARD: all data-parallel ranks;
    /// HYBRID_SHARD: `fsdp_size` consecutive ranks).
    group: ProcessGroup,
    /// HYBRID_SHARD: the ranks holding the same shard (gradients are averaged over it).
    replicate: Option<ProcessGroup>,
    /// Every data-parallel rank (batch statistics, micro-batch counts): the world, or under
    /// Ulysses the ranks at this rank's place in their sequence-parallel groups.
    dp: ProcessGroup,
    /// The Ulysses group (ranks sharing rows, each with a shard of every sequence).
    sp: Option<ProcessGroup>,
    /// With its lr schedule.
    optimizer: Option<Optimizer>,
    settings: FsdpSettings,
    peak_gathered: i64,
}

impl<H: FsdpHead> std::fmt::Debug for FsdpEngine<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsdpEngine")
            .field("settings", &self.settings)
            .field("group", &self.group)
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

/// This rank's group among the blocks of `n` consecutive ranks of `all`, and among the
/// strides (ranks `i, i + n, …`); `names` say which is which in errors.
fn blocks_and_strides(
    all: &ProcessGroup,
    n: usize,
    names: (&str, &str),
) -> Result<(ProcessGroup, ProcessGroup)> {
    let world = all.size();
    let blocks: Vec<Vec<usize>> = (0..world / n)
        .map(|b| (b * n..(b + 1) * n).collect())
        .collect();
    let strides: Vec<Vec<usize>> = (0..n).map(|i| (i..world).step_by(n).collect()).collect();
    let missing = |what: &str| EngineError::Config(format!("this rank is in no {what} group"));
    let block = all
        .split(&blocks)
        .map_err(FsdpError::from)?
        .ok_or_else(|| missing(names.0))?;
    let stride = all
        .split(&strides)
        .map_err(FsdpError::from)?
        .ok_or_else(|| missing(names.1))?;
    Ok((block, stride))
}

fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("model.layers.")?;
    rest.split('.').next()?.parse().ok()
}

impl<H: FsdpHead> FsdpEngine<H> {
    /// The module; its parameters are empty except inside the engine's passes or between
    /// [`FsdpEngine::summon_full_params`] and [`FsdpEngine::reshard`].
    pub fn module(&self) -> &H {
        &self.module
    }

    /// FULL_SHARD over `group`: builds the model as the single engine does (same weights on
    /// every rank), then shards every unit over `group` and frees the full parameters.
    pub fn new(settings: FsdpSettings, group: ProcessGroup) -> Result<Self> {
        Self::with_mesh(settings, group, -1)
    }

    /// verl's device mesh: `fsdp_size < 0` or `>= world` shards over all of `dp`
    /// (FULL_SHARD); otherwise HYBRID_SHARD: mesh `(world / fsdp_size, fsdp_size)`, parameters
    /// sharded over each block of `fsdp_size` consecutive ranks and replicated across blocks.
    ///
    /// With `settings.ulysses` = `u` > 1, blocks of `u` consecutive ranks form the Ulysses
    /// groups and ranks `i, i + u, …` the data-parallel groups (verl's `(dp, sp)` mesh).
    pub fn with_mesh(settings: FsdpSettings, all: ProcessGroup, fsdp_size: i64) -> Result<Self> {
        let world = all.size();
        let u = settings.ulysses.max(1);
        if u > 1 && !settings.engine.remove_padding {
            return Err(EngineError::Config(
                "Ulysses sequence parallelism runs on packed sequences: enable use_remove_padding"
                    .into(),
            ));
        }
        if !world.is_multiple_of(u) {
            return Err(EngineError::Config(format!(
                "ulysses_sequence_parallel_size {u} must divide the world size {world}"
            )));
        }
        let (dp, sp) = if u > 1 {
            let (sp, dp) = blocks_and_strides(&all, u, ("sequence-parallel", "data-parallel"))?;
            (dp, Some(sp))
        } else {
            (all.clone(), None)
        };
        let (group, replicate) = if fsdp_size < 0 || fsdp_size as usize >= world {
            (all.clone(), None)
        } else {
            let f = fsdp_size as usize;
            if f == 0 || !world.is_multiple_of(f) {
                return Err(EngineError::Config(format!(
                    "fsdp_size {fsdp_size} must divide the data-parallel size {world}"
                )));
            }
            let (shard, rep) = blocks_and_strides(&all, f, ("shard", "replicate"))?;
            (shard, Some(rep))
        };
        Self::build(settings, group, replicate, dp, sp)
    }

    fn build(
        settings: FsdpSettings,
        group: ProcessGroup,
        replicate: Option<ProcessGroup>,
        dp: ProcessGroup,
        sp: Option<ProcessGroup>,
    ) -> Result<Self> {
        let es = &settings.engine;
        let path = &es.model_path;
        let source = ModelSource::parse(path)?;
        let mut config = es.model_config(&source)?;
        config.lora = es.lora.clone();
        let vs = VarStore::new(es.device);
        let module = H::build(&config, vs.root())
            .map_err(|msg| EngineError::Config(format!("model `{path}`: {msg}")))?;
        let mut vs = vs;
        vs.set_kind(es.param_dtype.kind());
        materialize(&vs, &source, &config, es.seed, H::fresh_prefixes())?;
        let ranks = (group.rank(), group.size());
        if es.main_dtype != Dtype::Fp32 && es.main_dtype != es.param_dtype {
            return Err(EngineError::Config(format!(
                "{} parameter shards under {} compute: the shards are fp32, or in the compute dtype",
                es.main_dtype.name(),
                es.param_dtype.name()
            )));
        }
        let shard = ShardPlace {
            device: if settings.param_offload {
                Device::Cpu
            } else {
                es.device
            },
            kind: es.main_dtype.kind(),
        };
        let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let n_layers = module.backbone().layers().len();
        let mut per_layer: Vec<Vec<(String, Tensor)>> = (0..n_layers).map(|_| Vec::new()).collect();
        let mut root_vars = Vec::new();
        for (name, var) in vars {
            match layer_of(&name) {
                Some(i) if i < n_layers => per_layer[i].push((name, var)),
                _ => root_vars.push((name, var)),
            }
        }
        // Under LoRA only the adapters train: the root and each layer's base weights are
        // frozen units, each layer's adapters a unit of their own.
        let lora = config.lora.is_some();
        let freeze_tower = settings.engine.optim.is_some_and(|o| o.freeze_vision_tower);
        let (tower, root_vars): (Vec<_>, Vec<_>) = root_vars
            .into_iter()
            .partition(|(n, _)| n.starts_with("visual."));
        let mut root = vec![FlatUnit::new("root", root_vars, ranks, shard, !lora)?];
        if !tower.is_empty() {
            // The tower's own adapters (LoRA on its layers) train unless it is frozen.
            let (adapters, base): (Vec<_>, Vec<_>) =
                tower.into_iter().partition(|(n, _)| lora && is_adapter(n));
            root.push(FlatUnit::new(
                "visual",
                base,
                ranks,
                shard,
                !lora && !freeze_tower,
            )?);
            if !adapters.is_empty() {
                root.push(FlatUnit::new(
                    "visual.lora",
                    adapters,
                    ranks,
                    shard,
                    !freeze_tower,
                )?);
            }
        }
        let root = UnitSet(root);
        let layers = per_layer
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let name = format!("model.layers.{i}");
                let (adapters, base): (Vec<_>, Vec<_>) =
                    v.into_iter().partition(|(n, _)| lora && is_adapter(n));
                let mut units = vec![FlatUnit::new(&name, base, ranks, shard, !lora)?];
                if !adapters.is_empty() {
                    let name = format!("{name}.lora");
                    units.push(FlatUnit::new(&name, adapters, ranks, shard, true)?);
                }
                Ok(UnitSet(units))
            })
            .collect::<Result<Vec<_>, FsdpError>>()?;
        let mut engine = FsdpEngine {
            _vs: vs,
            module,
            config,
            root,
            layers,
            group,
            replicate,
            dp,
            sp,
            optimizer: None,
            settings,
            peak_gathered: 0,
        };
        engine.build_optimizer()?;
        Ok(engine)
    }

    /// The flat units, root first, then the layers in order.
    pub fn units(&self) -> impl Iterator<Item = &FlatUnit> {
        self.root
            .iter()
            .chain(self.layers.iter().flat_map(UnitSet::iter))
    }

    fn build_optimizer(&mut self) -> Result<()> {
        let Some(o) = self.settings.engine.optim else {
            return Ok(());
        };
        let params: Vec<NamedParam> = self
            .units()
            .filter(|u| u.trainable())
            .map(|u| NamedParam::new(format!("fsdp.{}", u.name()), u.shard().shallow_clone()))
            .collect();
        // The shards are the main params: fp32 for every compute dtype (fp16 adds the loss
        // scaler), or bf16 ones stepped in place (`model_dtype: bf16`).
        let es = &self.settings.engine;
        let precision = match (es.param_dtype, es.main_dtype) {
            (Dtype::Fp16, _) => Dtype::Fp16,
            (_, main) => main,
        };
        self.optimizer = Some(stack::build(
            single_group(params, o.lr, o.weight_decay),
            &o,
            precision,
            es.main_dtype,
            es.loss_scaling,
        )?);
        Ok(())
    }

    pub fn settings(&self) -> &FsdpSettings {
        &self.settings
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// The group the batch's rows are split over (the world unless Ulysses is on).
    pub fn data_group(&self) -> &ProcessGroup {
        &self.dp
    }

    /// The optimizer over this rank's shards (None for a forward-only engine); its
    /// [`Optimizer::scaler`] is the fp16 loss scaler, the same on every rank.
    pub fn optimizer(&self) -> Option<&Optimizer> {
        self.optimizer.as_ref()
    }

    /// Bytes of this rank's shards, shard gradients and optimizer state, and the peak of
    /// gathered units so far.
    pub fn memory(&self) -> MemoryReport {
        let bytes = crate::ops::tensor_bytes;
        let params = self.units().map(|u| bytes(u.shard())).sum();
        let grads = self.units().map(|u| bytes(&u.shard().grad())).sum();
        let optimizer = self.optimizer.as_ref().map_or(0, |o| {
            let (main, state) = o.owned_bytes();
            main + state
        });
        MemoryReport {
            params,
            grads,
            optimizer,
            peak_gathered: self.peak_gathered,
        }
    }

    fn note_gathered(&mut self) {
        let now: i64 = self.units().map(FlatUnit::gathered_bytes).sum();
        self.peak_gathered = self.peak_gathered.max(now);
    }

    fn optimizer_mut(&mut self) -> Result<&mut Optimizer> {
        self.optimizer
            .as_mut()
            .ok_or_else(|| EngineError::Config("this engine is forward-only (no optimizer)".into()))
    }

    /// Every micro-batch step is a sequence of collectives, so every rank must run the same
    /// number of micro-batches.
    fn check_micro_batches(&self, n: usize) -> Result<()> {
        let t = Tensor::from_slice(&[n as f64, -(n as f64)]);
        self.dp
            .all_reduce(&t, ReduceOp::Max)
            .map_err(FsdpError::from)?;
        let (max, min) = (t.f_double_value(&[0])?, -t.f_double_value(&[1])?);
        if max != min {
            return Err(EngineError::Batch(format!(
                "data-parallel ranks have different micro-batch counts ({min} to {max}); give every rank the same rows"
            )));
        }
        Ok(())
    }

    /// verl's `global_batch_info`: valid tokens and non-empty sequences summed over the group.
    fn global_agg(&self, batch: &Batch) -> Result<crate::algo::AggOptions> {
        let mut agg = global_agg_options(
            batch,
            self.dp.size(),
            self.settings.engine.loss_scale_factor,
        )?;
        let t = Tensor::from_slice(&[batch.num_tokens()?, batch.num_nonempty()?]);
        self.dp
            .all_reduce(&t, ReduceOp::Sum)
            .map_err(FsdpError::from)?;
        let (tokens, seqs) = (t.f_double_value(&[0])?, t.f_double_value(&[1])?);
        agg.batch_num_tokens = (tokens > 0.0).then_some(tokens);
        agg.global_batch_size = (seqs > 0.0).then_some(seqs);
        Ok(agg)
    }

    /// Embedding and the layers' inputs of a micro-batch (the root is gathered).
    /// Packed when the settings say so and the micro-batch has enough padding to gain from it;
    /// always under Ulysses, which splits the packed tokens.
    fn inputs(&self, mb: &Batch) -> Result<(Tensor, LayerInputs)> {
        let packed = self.settings.engine.remove_padding
            && (self.sp.is_some()
                || crate::model::packed::worth_packing(mb.get("attention_mask")?));
        let embeds = self.module.input_embeds(mb)?;
        LayerInputs::new(self.module.backbone(), mb, packed, self.sp.as_ref(), embeds)
    }

    /// Layer `i` on its input `x`; the last layer returns only the head's window.
    fn layer_forward(&self, i: usize, x: &Tensor, inputs: &LayerInputs) -> Result<Tensor> {
        inputs.layer_forward(self.module.backbone().layers(), i, x)
    }

    /// Forward of one micro-batch, unit by unit; returns the boundary activations
    /// (`saved[i]` is layer i's input, `saved[L]` the last layer's output at the head's
    /// window). With `graphs`, each layer runs with autograd from its own input (a detached
    /// leaf) and its output with that graph is returned too (`outputs[i]`), for a backward
    /// without recomputation; the layers then stay gathered, as their graphs hold the
    /// parameters.
    fn forward_boundaries(&mut self, mb: &Batch, keep: bool, graphs: bool) -> Result<Boundaries> {
        self.root.gather(&self.group)?;
        self.note_gathered();
        let (x0, inputs) = tch::no_grad(|| self.inputs(mb))?;
        let mut saved = vec![x0];
        let mut outputs = Vec::new();
        for i in 0..self.layers.len() {
            self.layers[i].gather(&self.group)?;
            self.note_gathered();
            let y = if graphs {
                let x = saved[i].f_detach()?.set_requires_grad(true);
                let y = self.layer_forward(i, &x, &inputs)?;
                saved[i] = x;
                outputs.push(y.shallow_clone());
                y.f_detach()?
            } else {
                tch::no_grad(|| self.layer_forward(i, &saved[i], &inputs))?
            };
            saved.push(y);
            if !keep && !graphs {
                self.layers[i].free()?;
            }
        }
        Ok(Boundaries {
            saved,
            outputs,
            inputs,
        })
    }

    fn micro_forward_backward(
        &mut self,
        mb: &Batch,
        fwd: &ForwardOptions,
        loss: &mut LossFn<'_, H::Output>,
        agg: &crate::algo::AggOptions,
    ) -> Result<Metrics> {
        let keep = !self.settings.reshard_after_forward;
        let recompute = self.settings.gradient_checkpointing;
        let Boundaries {
            saved,
            outputs,
            inputs,
        } = self.forward_boundaries(mb, keep, !recompute)?;
        let n = self.layers.len();
        // Head: loss to the last boundary (and the root's head parameters).
        let last = saved[n].f_detach()?.set_requires_grad(true);
        let output = inputs.head_output(&self.module, &last, mb, fwd)?;
        let micro = loss(mb, output, agg)?;
        // Loss scale and pre-divide: see the module docs.
        let factor = self.optimizer_mut()?.loss_scale() / self.dp.size() as f64;
        let scaled = if factor == 1.0 {
            micro.loss.shallow_clone()
        } else {
            micro.loss.f_mul_scalar(factor)?
        };
        scaled.f_backward()?;
        let mut g = last.grad();
        // Layers in reverse: recompute from the saved input (or take the forward's graph),
        // back-propagate the boundary grad.
        let reduce = self.settings.reduce_dtype;
        let mut outputs = outputs;
        // The gradients of the DeepStack levels: each is its layer output's.
        let mut deepstack_grads: Vec<Tensor> = (0..inputs.deepstack_levels())
            .map(|_| Tensor::new())
            .collect();
        for i in (0..n).rev() {
            if let Some(slot) = deepstack_grads.get_mut(i) {
                *slot = g.shallow_clone();
            }
            let (x, y) = if recompute {
                self.layers[i].gather(&self.group)?;
                self.note_gathered();
                let x = saved[i].f_detach()?.set_requires_grad(true);
                let y = self.layer_forward(i, &x, &inputs)?;
                (x, y)
            } else {
                let y = outputs.pop().ok_or_else(|| {
                    FsdpError::Config("a layer's forward graph is missing".into())
                })?;
                (saved[i].shallow_clone(), y)
            };
            if g.defined() {
                crate::ops::backward(&[y], &[g.f_to_kind(x.kind())?], false)
                    .map_err(FsdpError::from)?;
            }
            g = x.grad();
            self.layers[i].reduce_grads(&self.group, reduce)?;
            self.layers[i].free()?;
        }
        // Embedding (frozen under LoRA: nothing to compute).
        if g.defined() && self.root.iter().any(FlatUnit::trainable) {
            let embeds = self.module.input_embeds(mb)?;
            let InputEmbeds { x, deepstack } = inputs.embed(self.module.backbone(), embeds)?;
            let kind = saved[0].kind();
            let mut outs = vec![x];
            let mut grads = vec![g.f_to_kind(kind)?];
            for (d, dg) in deepstack.into_iter().zip(deepstack_grads) {
                if dg.defined() {
                    outs.push(d);
                    grads.push(dg.f_to_kind(kind)?);
                }
            }
            crate::ops::backward(&outs, &grads, false).map_err(FsdpError::from)?;
        }
        self.root.reduce_grads(&self.group, reduce)?;
        self.root.free()?;
        Ok(micro.metrics)
    }

    /// Full parameters by name, gathered unit by unit (every rank takes part; all get them).
    pub fn full_params(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for u in self.units() {
            out.extend(u.full_params(&self.group)?);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Hybrid engine, rollout side: materialises every unit so [`Engine::module`] can generate
    /// (verl's `summon_full_params`). Call [`FsdpEngine::reshard`] after generation.
    pub fn summon_full_params(&mut self) -> Result<()> {
        self.root.gather(&self.group)?;
        for u in &mut self.layers {
            u.gather(&self.group)?;
        }
        self.note_gathered();
        Ok(())
    }

    /// Frees every gathered unit (the module's parameters become empty again).
    pub fn reshard(&mut self) -> Result<()> {
        self.root.free()?;
        for u in &mut self.layers {
            u.free()?;
        }
        Ok(())
    }
}

impl From<FsdpError> for EngineError {
    fn from(e: FsdpError) -> Self {
        match e {
            FsdpError::Torch(t) => EngineError::Torch(t),
            other => EngineError::Config(other.to_string()),
        }
    }
}

impl<H: FsdpHead> Engine for FsdpEngine<H> {
    type Head = H;

    fn model_config(&self) -> &crate::model::ModelConfig {
        self.module.config()
    }

    fn set_adapters_enabled(&self, enabled: bool) -> Result<()> {
        self.module.backbone().set_adapters_enabled(enabled);
        Ok(())
    }

    fn forward_backward(
        &mut self,
        batch: &Batch,
        micro: &MicroBatching,
        fwd: &ForwardOptions,
        loss: &mut LossFn<'_, H::Output>,
    ) -> Result<Vec<Metrics>> {
        self.optimizer_mut()?;
        let agg = self.global_agg(batch)?;
        let mbs = micro.cut(batch)?;
        self.check_micro_batches(mbs.len())?;
        let mut out = Vec::with_capacity(mbs.len());
        for mb in &mbs {
            out.push(self.micro_forward_backward(mb, fwd, loss, &agg)?);
        }
        Ok(out)
    }

    fn infer_batch(
        &mut self,
        batch: &Batch,
        micro: &MicroBatching,
        fwd: &ForwardOptions,
    ) -> Result<Vec<H::Output>> {
        let _guard = tch::no_grad_guard();
        let mbs = micro.cut(batch)?;
        self.check_micro_batches(mbs.len())?;
        let mut out = Vec::with_capacity(mbs.len());
        for mb in &mbs {
            let Boundaries { saved, inputs, .. } = self.forward_boundaries(mb, false, false)?;
            let last = saved
                .last()
                .map(Tensor::shallow_clone)
                .ok_or_else(|| EngineError::Config("no boundary".into()))?;
            out.push(inputs.head_output(&self.module, &last, mb, fwd)?);
            self.root.free()?;
        }
        Ok(out)
    }

    fn optimizer_zero_grad(&mut self) -> Result<()> {
        Ok(self.optimizer_mut()?.zero_grad()?)
    }

    fn optimizer_step(&mut self) -> Result<StepResult> {
        if let Some(rep) = &self.replicate {
            // HYBRID_SHARD: sum the accumulated shard gradients over the replicas (pre-divided),
            // in the reduce dtype as PyTorch's HSDP does (bf16 shards' grads summed in fp32).
            let reduce = self.settings.reduce_dtype;
            let grads: Vec<Tensor> = self
                .units()
                .map(|u| u.shard().grad())
                .filter(Tensor::defined)
                .collect();
            let wide: Vec<Tensor> = grads
                .iter()
                .map(|g| g.f_to_kind(reduce))
                .collect::<Result<_, _>>()
                .map_err(FsdpError::from)?;
            rep.all_reduce_many(&wide, ReduceOp::Sum)
                .map_err(FsdpError::from)?;
            for (g, w) in grads.iter().zip(&wide) {
                // A no-op view when the kinds agree (`to_kind` returned the same tensor).
                if g.kind() != reduce {
                    tch::no_grad(|| g.shallow_clone().f_copy_(w)).map_err(FsdpError::from)?;
                }
            }
        }
        // Found-inf over every data-parallel rank (shard and replicate groups), so all skip the
        // same steps and keep the same loss scale; the norm over one copy of the shards.
        let (group, dp) = (self.group.clone(), self.dp.clone());
        let opt = self.optimizer_mut()?;
        let outcome = opt.step_with_groups(Some(&dp), Some(&group))?;
        opt.zero_grad()?;
        Ok(StepResult {
            grad_norm: outcome.grad_norm,
            update_successful: outcome.update_successful,
        })
    }

    fn lr_scheduler_step(&mut self) -> Result<f64> {
        Ok(self.optimizer_mut()?.scheduler_step(1))
    }

    fn lr(&self) -> f64 {
        self.optimizer.as_ref().map_or(0.0, Optimizer::lr)
    }

    fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        let ck = |msg: String| EngineError::Checkpoint {
            path: dir.to_path_buf(),
            msg,
        };
        let full = self.full_params()?;
        if self.dp.rank() == 0 {
            std::fs::create_dir_all(dir).map_err(|e| ck(e.to_string()))?;
            let arch = H::architecture(&self.config).map_err(ck)?;
            save_model(
                dir,
                &full,
                &self.config,
                arch,
                &self.settings.engine.model_path,
            )?;
        }
        let first_replica = self.replicate.as_ref().is_none_or(|r| r.rank() == 0);
        if let Some(opt) = self.optimizer.as_ref().filter(|_| first_replica) {
            std::fs::create_dir_all(dir).map_err(|e| ck(e.to_string()))?;
            opt.save(&ckpt::optim_file(dir, self.group.size(), self.group.rank()))?;
        }
        self.dp.barrier().map_err(FsdpError::from)?;
        Ok(())
    }

    fn load_checkpoint(&mut self, dir: &Path) -> Result<()> {
        let hf = dir.join(HF_DIR);
        let ckpt = Checkpoint::open(&hf)?;
        // The full weights, once, in host memory (a full-state-dict load).
        let tmp = VarStore::new(Device::Cpu);
        let _shape = H::build(&self.config, tmp.root()).map_err(EngineError::Config)?;
        let opts = LoadOptions {
            strict_unexpected: false,
            ..LoadOptions::default()
        };
        let report = load_weights(&tmp, &ckpt, &opts)?;
        if let Some(m) = report.missing.first() {
            return Err(EngineError::Checkpoint {
                path: hf,
                msg: format!("no tensor `{m}`"),
            });
        }
        if self.config.lora.is_some() {
            load_adapter(&tmp, &dir.join(ADAPTER_DIR))?;
        }
        let full = tmp.variables();
        let get = |name: &str| full.get(name).map(Tensor::shallow_clone);
        let rank = self.group.rank();
        self.root.load_full(rank, &get)?;
        for u in &mut self.layers {
            u.load_full(rank, &get)?;
        }
        let numel: std::collections::HashMap<String, i64> = self
            .units()
            .map(|u| (format!("fsdp.{}", u.name()), u.numel()))
            .collect();
        let (world, rank) = (self.group.size(), self.group.rank());
        if let Some(opt) = self.optimizer.as_mut() {
            opt.reload_model_params()?;
            let old = ckpt::saved_world_size(dir)?;
            let (path, temp) = if old == world {
                (ckpt::optim_file(dir, world, rank), false)
            } else {
                let tmp = std::env::temp_dir().join(format!(
                    "verlc-fsdp-reshard-{}-{rank}.safetensors",
                    std::process::id()
                ));
                ckpt::reshard(dir, old, world, rank, &numel, &tmp)?;
                (tmp, true)
            };
            let loaded = opt.load(&path);
            if temp {
                let _ = std::fs::remove_file(&path);
            }
            loaded?;
        }
        Ok(())
    }

    fn per_tensor_params(&self) -> Result<Vec<(String, Tensor)>> {
        self.full_params()
    }

    fn load_params(&mut self, named: &[(String, Tensor)]) -> Result<()> {
        let given: std::collections::HashMap<&str, &Tensor> =
            named.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let get = |name: &str| given.get(name).map(|t| t.shallow_clone());
        let rank = self.group.rank();
        self.root.load_full(rank, &get)?;
        for u in &mut self.layers {
            u.load_full(rank, &get)?;
        }
        if let Some(opt) = self.optimizer.as_mut() {
            opt.reload_model_params()?;
        }
        Ok(())
    }

    fn dp_size(&self) -> usize {
        self.dp.size()
    }

    fn dp_rank(&self) -> usize {
        self.dp.rank()
    }

    fn max_over_ranks(&self, n: usize) -> Result<usize> {
        let t = Tensor::from_slice(&[n as i64]);
        self.dp
            .all_reduce(&t, ReduceOp::Max)
            .map_err(FsdpError::from)?;
        Ok(usize::try_from(t.f_int64_value(&[0])?).unwrap_or(n))
    }
}
