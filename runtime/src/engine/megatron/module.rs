//! [`MegatronModule`]: one rank's part of a TP x PP x DP model with its optimizer.
//!
//! A training step is [`MegatronModule::forward_backward`] over the micro-batches of this
//! DP rank (1F1B through the stages, the loss on the last stage), then
//! [`MegatronModule::step`]: gradient finalisation as Megatron's `finalize_model_grads`
//! (the tied embedding's gradient summed over the embedding group; with the replicated
//! optimizer, every gradient averaged over DP) and the optimizer step (the distributed
//! optimizer reduce-scatters over DP itself).
use std::path::Path;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::model::ModelConfig;
use crate::model::load::{Checkpoint, LoadReport};
use crate::model::tensor_parallel::is_routed_expert_param;
use crate::optim::distrib::{
    DistGroups, DistParam, DistributedOptimizer, ExpertSharding, LayoutOptions,
};
use crate::optim::{LossScaling, NamedParam, Optimizer, OptimizerConfig, ParamGroup, StepOutcome};
use crate::parallel::dist::{ProcessGroup, ReduceOp};
use crate::parallel::layout::ProcessGroups;
use crate::parallel::mappings::Tape;
use crate::parallel::tp::shard::{gather_tensor, load_sharded, shard_tensor};

use super::schedule::{ActivationSpec, Pipeline, StageStep, forward_backward_1f1b, forward_only};
use super::stage::{
    ExpertPlacement, HeadKind, ParallelModel, Stage, StageImages, StageInput, full_shapes,
};
use super::{MegatronError, Result};
use crate::parallel::tp::context::ContextParallel;

/// One micro-batch of sequences, `(rows, T)` each (positions `(rows, T, 3)` for a
/// vision-language model).
#[derive(Debug)]
pub struct MicroBatch {
    pub input_ids: Tensor,
    pub position_ids: Tensor,
    /// 1 for real tokens; `None` for no padding.
    pub attention_mask: Option<Tensor>,
    /// The rows' images, for the first stage (`None`: none).
    pub images: Option<MicroImages>,
}

/// A micro-batch's images: their patches stacked in placeholder order, their grids, and how
/// many columns the prompts take.
#[derive(Debug)]
pub struct MicroImages {
    pub pixels: Tensor,
    pub grids: Vec<[i64; 3]>,
    /// Which items are videos.
    pub videos: Vec<bool>,
    pub prompt_width: i64,
}

impl MicroBatch {
    /// What the first stage takes: the ids, with the images when there are some.
    fn stage_input(&self) -> StageInput<'_> {
        match &self.images {
            Some(i) if !i.grids.is_empty() => StageInput::Multimodal(
                &self.input_ids,
                StageImages {
                    pixels: &i.pixels,
                    grids: &i.grids,
                    videos: &i.videos,
                    prompt_width: i.prompt_width,
                },
            ),
            _ => StageInput::Ids(&self.input_ids),
        }
    }
}

/// How the optimizer is distributed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParallelSettings {
    /// Megatron's `use_distributed_optimizer` (ZeRO-1 over DP).
    pub use_distributed_optimizer: bool,
    pub layout: LayoutOptions,
}

/// The optimizer of a [`MegatronModule`].
pub enum ModuleOptimizer {
    /// State sharded over DP.
    Distributed(DistributedOptimizer),
    /// State replicated over DP; gradients all-reduced first.
    Replicated(Optimizer),
}

impl std::fmt::Debug for ModuleOptimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModuleOptimizer::Distributed(o) => o.fmt(f),
            ModuleOptimizer::Replicated(o) => f
                .debug_struct("Optimizer")
                .field("config", o.config())
                .finish_non_exhaustive(),
        }
    }
}

/// The closure that turns the last stage's final hidden states of micro-batch `mb` into a
/// tensor (a scalar loss when training). It gets the model and the tape for the head.
pub type HeadFn<'a> = dyn FnMut(usize, &ParallelModel, &mut Tape, &Tensor) -> Result<Tensor> + 'a;

/// Bytes one rank holds (on its device or, for offloaded optimizer state, on the host).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModuleMemory {
    /// The model's parameters (this rank's TP slice of its stage's layers): with the
    /// distributed optimizer its param buffer, which the parameters it steps are views of.
    pub params: i64,
    /// Gradients of those parameters, plus the distributed optimizer's fp32 grad buffer.
    pub grads: i64,
    /// fp32 main params, their grads and the optimizer state: this rank's `1 / DP` share with
    /// the distributed optimizer.
    pub optimizer: i64,
}

/// One rank's model, groups and optimizer; see the module docs.
pub struct MegatronModule {
    pub vs: VarStore,
    pub model: ParallelModel,
    groups: Option<ProcessGroups>,
    optimizer: Option<ModuleOptimizer>,
    /// `[load balancing, z]` of every mixture-of-experts layer of this stage, per
    /// micro-batch, from the last [`MegatronModule::forward_backward`] (this rank's shares).
    router_values: Vec<[f64; 2]>,
}

impl std::fmt::Debug for MegatronModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MegatronModule")
            .field("stage", &self.model.stage)
            .finish_non_exhaustive()
    }
}

fn active(g: &ProcessGroup) -> Option<&ProcessGroup> {
    (g.size() > 1).then_some(g)
}

impl MegatronModule {
    /// Builds this rank's part of the model (zero weights) on `device` in `kind`. `groups`
    /// gives the TP group and the pipeline stage (`None`: one process).
    pub fn new(
        cfg: &ModelConfig,
        head: HeadKind,
        groups: Option<ProcessGroups>,
        device: Device,
        kind: Kind,
    ) -> Result<Self> {
        Self::with_sequence_parallel(cfg, head, groups, device, kind, false)
    }

    /// [`new`](Self::new) with Megatron's sequence parallelism (used with a TP group of more
    /// than one rank; micro-batches are padded on the right to a multiple of the TP size).
    pub fn with_sequence_parallel(
        cfg: &ModelConfig,
        head: HeadKind,
        groups: Option<ProcessGroups>,
        device: Device,
        kind: Kind,
        sequence_parallel: bool,
    ) -> Result<Self> {
        let layers = usize::try_from(cfg.num_hidden_layers)
            .map_err(|_| MegatronError::Config("negative layer count".into()))?;
        let stage = match &groups {
            Some(g) => Stage::split(layers, g.pp.rank(), g.pp.size())?,
            None => Stage::single(layers),
        };
        let mut vs = VarStore::new(device);
        let tp = groups.as_ref().and_then(|g| active(&g.tp).cloned());
        let experts = ExpertPlacement {
            group: groups
                .as_ref()
                .and_then(|g| g.experts.as_ref())
                .map(|e| e.ep.clone()),
            split_over_tp: groups.as_ref().is_none_or(|g| g.experts_split_over_tp),
        };
        let mut model =
            ParallelModel::with_experts(cfg, &vs, head, stage, tp, sequence_parallel, experts)?;
        let cp = groups
            .as_ref()
            .and_then(|g| g.cp.as_ref())
            .and_then(ContextParallel::new);
        if let Some(what) = cp.as_ref().and_then(|_| cfg.megatron_gap(true, false)) {
            return Err(MegatronError::Config(format!(
                "{what} on the Megatron engine: not implemented (`verlc build` refuses it)"
            )));
        }
        model.set_context_parallel(cp);
        vs.set_kind(kind);
        Ok(MegatronModule {
            vs,
            model,
            groups,
            optimizer: None,
            router_values: Vec::new(),
        })
    }

    pub fn groups(&self) -> Option<&ProcessGroups> {
        self.groups.as_ref()
    }

    fn tp(&self) -> Option<&ProcessGroup> {
        self.groups.as_ref().and_then(|g| active(&g.tp))
    }

    fn pipeline(&self) -> Pipeline<'_> {
        Pipeline::new(self.groups.as_ref().map(|g| &g.pp))
    }

    fn dp(&self) -> Option<&ProcessGroup> {
        self.groups.as_ref().and_then(|g| active(&g.dp))
    }

    pub fn dp_rank_size(&self) -> (usize, usize) {
        self.groups
            .as_ref()
            .map_or((0, 1), |g| (g.dp.rank(), g.dp.size()))
    }

    /// Copies this rank's part of full (unsharded) tensors, by name, into the model.
    pub fn load_full(&mut self, named: &[(String, Tensor)]) -> Result<()> {
        let (rank, size) = crate::parallel::tp::rank_size(self.tp());
        let vars = self.vs.variables();
        let mut seen = 0usize;
        for (name, full) in named {
            let Some(var) = vars.get(name) else { continue };
            let part = shard_tensor(full, self.model.shard_spec(name), rank, size)
                .map_err(MegatronError::Config)?;
            if part.size() != var.size() {
                return Err(MegatronError::Config(format!(
                    "`{name}`: shard {:?}, variable {:?}",
                    part.size(),
                    var.size()
                )));
            }
            tch::no_grad(|| var.shallow_clone().f_copy_(&part))?;
            seen += 1;
        }
        if seen != vars.len() {
            let missing: Vec<&String> = vars
                .keys()
                .filter(|k| !named.iter().any(|(n, _)| n == *k))
                .collect();
            return Err(MegatronError::Config(format!(
                "no tensor given for {missing:?}"
            )));
        }
        self.reload_main_params()
    }

    /// Loads this rank's part of a Hugging Face checkpoint directory.
    pub fn load_pretrained(&mut self, dir: &Path, allow_missing: &[String]) -> Result<LoadReport> {
        let (rank, size) = crate::parallel::tp::rank_size(self.tp());
        let ckpt = Checkpoint::open(dir)?;
        let model = &self.model;
        let spec = move |name: &str| model.shard_spec(name);
        let report = load_sharded(&self.vs, &ckpt, &spec, rank, size, allow_missing)?;
        self.reload_main_params()?;
        Ok(report)
    }

    /// Copies the model params into the optimizer's main params (after loading weights).
    pub fn reload_main_params(&mut self) -> Result<()> {
        match &mut self.optimizer {
            Some(ModuleOptimizer::Distributed(o)) => o.reload_model_params()?,
            Some(ModuleOptimizer::Replicated(o)) => o.reload_model_params()?,
            None => {}
        }
        Ok(())
    }

    /// The parameters with the facts the optimizer needs (norm membership, sharing).
    pub fn dist_params(&self) -> Vec<DistParam> {
        let tp_rank = self.tp().map_or(0, ProcessGroup::rank);
        self.model
            .params()
            .into_iter()
            .map(|p| DistParam {
                in_grad_norm: (p.tensor_parallel || p.differs_over_tp || tp_rank == 0)
                    && !p.output_copy,
                name: p.name,
                tensor: p.tensor.set_requires_grad(true),
                shared_embedding: p.shared_embedding,
                is_embedding_or_output: p.is_embedding_or_output,
            })
            .collect()
    }

    /// Creates the optimizer. `make_groups` gets the model params (e.g.
    /// [`crate::optim::param_groups::megatron_param_groups`]).
    pub fn build_optimizer(
        &mut self,
        config: OptimizerConfig,
        make_groups: impl FnOnce(Vec<NamedParam>) -> Vec<ParamGroup>,
        settings: ParallelSettings,
        scaling: LossScaling,
    ) -> Result<()> {
        let expert_groups = self.groups.as_ref().and_then(|g| g.experts.clone());
        let experts = expert_groups.as_ref().map(|e| e.ep.clone());
        let params = self.dist_params();
        let opt = if settings.use_distributed_optimizer {
            // Under context parallelism the state is sharded over DP x CP, as Megatron's
            // `dp_cp` group does: the reduce-scatter there sums the CP ranks' partial
            // gradients and averages over the DP replicas.
            let dp_cp = self.groups.as_ref().and_then(|g| g.dp_cp.clone());
            let replicas = dp_cp.as_ref().map(|_| self.dp_rank_size().1);
            let groups = DistGroups {
                replicas,
                dp: dp_cp.or_else(|| self.dp().cloned()),
                stats: self.groups.as_ref().and_then(|g| active(&g.world).cloned()),
                // The experts' state is sharded over the ranks that hold the same experts.
                experts: expert_groups.map(|e| ExpertSharding {
                    group: e.expert_dp,
                    is_expert: is_routed_expert_param,
                }),
            };
            ModuleOptimizer::Distributed(DistributedOptimizer::new(
                params,
                make_groups,
                config,
                groups,
                settings.layout,
                scaling,
            )?)
        } else {
            let named = params
                .into_iter()
                .map(|p| NamedParam {
                    name: p.name,
                    tensor: p.tensor,
                    is_embedding_or_output: p.is_embedding_or_output,
                    in_grad_norm: p.in_grad_norm,
                })
                .collect();
            let mut o = Optimizer::with_scaling(make_groups(named), config, scaling)?;
            if let Some(ep) = experts {
                // Each expert's gradient is on one rank of the group: the norm sums them there.
                // Whole experts (expert TP 1) on a group that spans tensor ranks: every
                // tensor rank then has the whole sum, which the model-parallel reduction
                // adds TP times.
                let tp = self.tp().map_or(1, ProcessGroup::size);
                let share = if self.model.experts_split_over_tp() {
                    1.0
                } else {
                    1.0 / tp as f64
                };
                o.set_local_params(ep, is_routed_expert_param, share);
            }
            ModuleOptimizer::Replicated(o)
        };
        self.optimizer = Some(opt);
        Ok(())
    }

    pub fn optimizer(&self) -> Option<&ModuleOptimizer> {
        self.optimizer.as_ref()
    }

    /// The inner optimizer (group options, scaler, state) of either kind.
    pub fn inner_optimizer(&self) -> Option<&Optimizer> {
        match &self.optimizer {
            Some(ModuleOptimizer::Distributed(o)) => Some(o.inner()),
            Some(ModuleOptimizer::Replicated(o)) => Some(o),
            None => None,
        }
    }

    pub fn inner_optimizer_mut(&mut self) -> Option<&mut Optimizer> {
        match &mut self.optimizer {
            Some(ModuleOptimizer::Distributed(o)) => Some(o.inner_mut()),
            Some(ModuleOptimizer::Replicated(o)) => Some(o),
            None => None,
        }
    }

    fn loss_scale(&self) -> f64 {
        self.inner_optimizer().map_or(1.0, Optimizer::loss_scale)
    }

    /// Trains on `mbs` with the 1F1B schedule; `loss` runs on the last stage and returns the
    /// micro-batch's scalar loss (already normalised for accumulation). Gradients accumulate.
    pub fn forward_backward(&mut self, mbs: &[MicroBatch], loss: &mut HeadFn<'_>) -> Result<()> {
        let scale = self.loss_scale();
        let pipe = self.pipeline();
        let padded = self.pad_sequences(mbs)?;
        let mbs = padded.as_deref().unwrap_or(mbs);
        let mut values = Vec::new();
        let mut step = Step {
            model: &self.model,
            mbs,
            head: loss,
            scale,
            router_values: &mut values,
        };
        let out = forward_backward_1f1b(&pipe, &mut step, mbs.len());
        self.router_values = values;
        out
    }

    /// The router losses' values of the last [`forward_backward`](Self::forward_backward):
    /// `[load balancing, z]` per mixture-of-experts layer of this stage and micro-batch,
    /// without coefficients (this rank's shares under context parallelism; empty when the
    /// model adds none).
    pub fn router_values(&self) -> &[[f64; 2]] {
        &self.router_values
    }

    /// Forward only (no gradients): `head` maps the last stage's hidden states of each
    /// micro-batch to an f32 tensor of shape `out_shape(mb)`, which every stage receives.
    pub fn forward_only(
        &mut self,
        mbs: &[MicroBatch],
        out_shape: &dyn Fn(usize) -> Vec<i64>,
        head: &mut HeadFn<'_>,
    ) -> Result<Vec<Tensor>> {
        let padded = self.pad_sequences(mbs)?;
        let mbs = padded.as_deref().unwrap_or(mbs);
        let pipe = self.pipeline();
        let device = self.model.device();
        let mut outs: Vec<Tensor> = Vec::with_capacity(mbs.len());
        {
            let mut collect =
                |mb: usize, m: &ParallelModel, tape: &mut Tape, h: &Tensor| -> Result<Tensor> {
                    let out = head(mb, m, tape, h)?;
                    outs.push(out.f_to_kind(Kind::Float)?.f_contiguous()?);
                    Ok(out)
                };
            let mut unused = Vec::new();
            let mut step = Step {
                model: &self.model,
                mbs,
                head: &mut collect,
                scale: 1.0,
                router_values: &mut unused,
            };
            tch::no_grad(|| forward_only(&pipe, &mut step, mbs.len()))?;
        }
        if pipe.stages() == 1 {
            return Ok(outs);
        }
        let mut result = Vec::with_capacity(mbs.len());
        for mb in 0..mbs.len() {
            let t = if pipe.is_last() {
                outs.get(mb)
                    .map(Tensor::shallow_clone)
                    .ok_or_else(|| MegatronError::Config("missing output".into()))?
            } else {
                Tensor::f_zeros(out_shape(mb).as_slice(), (Kind::Float, device))?
            };
            pipe.broadcast_from_last(&t)?;
            result.push(t);
        }
        Ok(result)
    }

    /// Under sequence or context parallelism, the micro-batches padded on the right to a
    /// multiple of [`ParallelModel::sequence_granule`] (padding masked out; positions of real
    /// tokens unchanged), else `None`.
    fn pad_sequences(&self, mbs: &[MicroBatch]) -> Result<Option<Vec<MicroBatch>>> {
        let w = self.model.sequence_granule();
        if w == 1
            || mbs
                .iter()
                .all(|m| m.input_ids.size().get(1).is_some_and(|t| t % w == 0))
        {
            return Ok(None);
        }
        // Along dim 1 (a vision-language model's positions are `(rows, T, 3)`).
        let pad = |t: &Tensor, value: i64| -> Result<Tensor> {
            let mut size = t.size();
            let len = size.get(1).copied().unwrap_or(0);
            if let Some(d) = size.get_mut(1) {
                *d = (w - len % w) % w;
            }
            let fill = Tensor::f_full(size.as_slice(), value, (t.kind(), t.device()))?;
            Ok(Tensor::f_cat(&[t.shallow_clone(), fill], 1)?)
        };
        let out = mbs
            .iter()
            .map(|m| {
                let rows = m.input_ids.size().first().copied().unwrap_or(0);
                let len = m.input_ids.size().get(1).copied().unwrap_or(0);
                let mask = match &m.attention_mask {
                    Some(mask) => mask.shallow_clone(),
                    None => Tensor::f_ones([rows, len], (Kind::Int64, m.input_ids.device()))?,
                };
                Ok(MicroBatch {
                    input_ids: pad(&m.input_ids, 0)?,
                    position_ids: pad(&m.position_ids, 0)?,
                    attention_mask: Some(pad(&mask, 0)?),
                    images: m.images.as_ref().map(|i| MicroImages {
                        pixels: i.pixels.shallow_clone(),
                        grids: i.grids.clone(),
                        videos: i.videos.clone(),
                        prompt_width: i.prompt_width,
                    }),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(out))
    }

    /// Megatron's `finalize_model_grads`: sums the tied embedding's gradient over the
    /// embedding group; with the replicated optimizer also averages every gradient over DP.
    pub fn finalize_grads(&mut self) -> Result<()> {
        let Some(groups) = &self.groups else {
            return Ok(());
        };
        if let Some(emb) = groups.embedding.as_ref().filter(|g| g.size() > 1)
            && let Some(p) = self.model.params().into_iter().find(|p| p.shared_embedding)
        {
            let g = p.tensor.grad();
            let g = if g.defined() {
                g
            } else {
                p.tensor.f_zeros_like()?
            };
            emb.all_reduce(&g, ReduceOp::Sum)?;
            crate::ops::set_grad(&p.tensor, Some(&g)).map_err(crate::optim::OptimError::from)?;
        }
        if let (Some(cp), Some(ModuleOptimizer::Replicated(_))) =
            (groups.cp.as_ref().filter(|g| g.size() > 1), &self.optimizer)
        {
            // Each rank's backward reached its own positions (and, through the gathered keys
            // and values, the others' queries' use of them): the sum is the whole gradient.
            // Every parameter takes part, so the ranks reduce the same list. (The distributed
            // optimizer sums them in its reduce-scatter over DP x CP.) Experts split over an
            // expert-parallel group, which spans context ranks, hold different experts there:
            // their gradients already hold the group's tokens and are summed over the ranks
            // that hold the same experts below.
            let mut grads = self.all_param_grads_named()?;
            if groups.experts.is_some() {
                grads.retain(|(name, _)| !is_routed_expert_param(name));
            }
            let grads: Vec<Tensor> = grads.into_iter().map(|(_, g)| g).collect();
            cp.all_reduce_many(&grads, ReduceOp::Sum)?;
        }
        if let Some(tp) = active(&groups.tp) {
            let partial: Vec<Tensor> = self
                .model
                .params()
                .iter()
                .filter(|p| p.grad_partial_over_tp)
                .map(|p| p.tensor.grad())
                .filter(Tensor::defined)
                .collect();
            if !partial.is_empty() {
                tp.all_reduce_many(&partial, ReduceOp::Sum)?;
            }
        }
        if let (Some(ModuleOptimizer::Replicated(_)), Some(dp)) =
            (&self.optimizer, active(&groups.dp))
        {
            match &groups.experts {
                None => dp.all_reduce_many(&self.param_grads(), ReduceOp::Avg)?,
                Some(experts) => {
                    // An expert's gradient already holds the contributions of every token of
                    // its expert-parallel group (they came through the exchange): summed over
                    // the ranks that hold the same expert, it covers every data-parallel
                    // rank's tokens, and 1/DP makes it the average dense gradients get.
                    let (mut dense, mut expert) = (Vec::new(), Vec::new());
                    for (name, g) in self.named_grads()? {
                        if is_routed_expert_param(&name) {
                            expert.push(g);
                        } else {
                            dense.push(g);
                        }
                    }
                    dp.all_reduce_many(&dense, ReduceOp::Avg)?;
                    if !expert.is_empty() {
                        if experts.expert_dp.size() > 1 {
                            experts.expert_dp.all_reduce_many(&expert, ReduceOp::Sum)?;
                        }
                        let scale = 1.0 / dp.size() as f64;
                        for g in &expert {
                            let _ = g.shallow_clone().f_mul_scalar_(scale)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Finalises the gradients and steps the optimizer.
    pub fn step(&mut self) -> Result<StepOutcome> {
        self.finalize_grads()?;
        let mp = self.groups.as_ref().and_then(|g| active(&g.mp).cloned());
        match &mut self.optimizer {
            Some(ModuleOptimizer::Distributed(o)) => Ok(o.step()?),
            Some(ModuleOptimizer::Replicated(o)) => {
                let out = o.step(mp.as_ref())?;
                o.zero_grad()?;
                Ok(out)
            }
            None => Err(MegatronError::Config(
                "step on a module without optimizer".into(),
            )),
        }
    }

    pub fn zero_grad(&mut self) -> Result<()> {
        for p in self.model.params() {
            crate::ops::set_grad(&p.tensor, None).map_err(crate::optim::OptimError::from)?;
        }
        Ok(())
    }

    /// Saves the optimizer state of this rank, its schedule with it, to `path`.
    pub fn save_optimizer(&self, path: &Path) -> Result<()> {
        match &self.optimizer {
            Some(ModuleOptimizer::Distributed(o)) => o.save(path)?,
            Some(ModuleOptimizer::Replicated(o)) => o.save(path)?,
            None => {}
        }
        Ok(())
    }

    /// Restores what [`save_optimizer`](Self::save_optimizer) wrote on this rank.
    pub fn load_optimizer(&mut self, path: &Path) -> Result<()> {
        match &mut self.optimizer {
            Some(ModuleOptimizer::Distributed(o)) => o.load(path)?,
            Some(ModuleOptimizer::Replicated(o)) => o.load(path)?,
            None => {}
        }
        Ok(())
    }

    /// What parameter offload moves: the distributed optimizer's param buffer (which the
    /// parameters it steps are views of) and the parameters that have storage of their own
    /// (all of them without it), each the whole of its storage.
    pub fn offloadable_params(&self) -> Vec<Tensor> {
        let mut out: Vec<Tensor> = self.own_storage_params().map(|p| p.tensor).collect();
        if let Some(ModuleOptimizer::Distributed(o)) = &self.optimizer {
            out.extend(o.param_buffers().map(Tensor::shallow_clone));
        }
        out
    }

    /// The gradients the parameters have (those without one are left out).
    /// `own` (this rank's parameters by name) with every other rank's experts of this stage
    /// added (this rank's tensor-parallel slices of them), each broadcast over the
    /// expert-parallel group by the rank that holds it (collective over it); `own` unchanged
    /// without expert parallelism.
    pub fn with_all_experts(&self, own: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
        if self.groups.as_ref().is_none_or(|g| g.experts.is_none()) {
            return Ok(own);
        }
        let cfg = &self.model.config;
        let (kind, device) = (self.model.kind(), self.model.device());
        let (_, tp_size) = crate::parallel::tp::rank_size(self.tp());
        let mut out = own;
        for (name, mut shape) in full_shapes(cfg, self.model.head_kind, &self.model.stage) {
            let Some((ep, owner)) = self.expert_owner(&name) else {
                continue;
            };
            // Experts split over TP: the expert-parallel group shares this rank's
            // tensor-parallel rank, and what travels is this rank's slice of each expert.
            // Whole experts travel whole.
            if let crate::model::tensor_parallel::ShardSpec::Dim(d) = self.model.shard_spec(&name)
                && let Some(len) = usize::try_from(d).ok().and_then(|d| shape.get_mut(d))
            {
                *len /= tp_size;
            }
            if owner == ep.rank() {
                let t = out
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, t)| t.shallow_clone())
                    .ok_or_else(|| MegatronError::Config(format!("this rank lacks `{name}`")))?;
                ep.broadcast(&t.f_contiguous()?, owner)?;
            } else {
                let t = Tensor::f_zeros(shape.as_slice(), (kind, device))?;
                ep.broadcast(&t, owner)?;
                out.push((name, t));
            }
        }
        Ok(out)
    }

    /// The expert-parallel group and the rank of it that holds the expert parameter `name`
    /// (`None` for a parameter every rank holds, or without expert parallelism).
    fn expert_owner(&self, name: &str) -> Option<(&ProcessGroup, usize)> {
        let ep = &self.groups.as_ref()?.experts.as_ref()?.ep;
        let rest = name.split(".mlp.experts.").nth(1)?;
        let e: i64 = rest.split('.').next()?.parse().ok()?;
        let local = self.model.config.moe.num_experts / ep.size() as i64;
        Some((ep, usize::try_from(e / local.max(1)).ok()?))
    }

    /// Every parameter's gradient by name: the defined ones, and an expert's always (a zero
    /// one when none of its group's tokens chose it), so that the ranks that hold the same
    /// experts reduce the same list.
    fn named_grads(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for p in self.model.params() {
            let g = p.tensor.grad();
            if g.defined() {
                out.push((p.name, g));
            } else if is_routed_expert_param(&p.name) {
                let z = p.tensor.f_zeros_like()?;
                crate::ops::set_grad(&p.tensor, Some(&z))
                    .map_err(crate::optim::OptimError::from)?;
                out.push((p.name, p.tensor.grad()));
            }
        }
        Ok(out)
    }

    /// Every parameter's gradient by name, a zero one set where there was none.
    fn all_param_grads_named(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for p in self.model.params() {
            if !p.tensor.grad().defined() {
                let z = p.tensor.f_zeros_like()?;
                crate::ops::set_grad(&p.tensor, Some(&z))
                    .map_err(crate::optim::OptimError::from)?;
            }
            out.push((p.name, p.tensor.grad()));
        }
        Ok(out)
    }

    fn param_grads(&self) -> Vec<Tensor> {
        self.model
            .params()
            .iter()
            .map(|p| p.tensor.grad())
            .filter(Tensor::defined)
            .collect()
    }

    /// The parameters that are not views of the distributed optimizer's param buffer.
    fn own_storage_params(&self) -> impl Iterator<Item = super::ParamInfo> + '_ {
        let buffer = match &self.optimizer {
            Some(ModuleOptimizer::Distributed(o)) => Some(o),
            _ => None,
        };
        self.model
            .params()
            .into_iter()
            .filter(move |p| buffer.is_none_or(|o| !o.binds(&p.name)))
    }

    /// What gradient offload moves: the parameters' gradients (where they have one) and the
    /// distributed optimizer's grad buffers.
    pub fn offloadable_grads(&self) -> Vec<Tensor> {
        let mut out = self.param_grads();
        if let Some(ModuleOptimizer::Distributed(o)) = &self.optimizer {
            out.extend(o.grad_buffers().map(Tensor::shallow_clone));
        }
        out
    }

    /// Bytes this rank holds for the model's parameters, their gradients and the optimizer;
    /// see [`ModuleMemory`].
    pub fn memory(&self) -> ModuleMemory {
        let bytes = crate::ops::tensor_bytes;
        let params = self.model.params();
        let mut mem = ModuleMemory {
            // Parameters viewing the param buffer are counted with it.
            params: self.own_storage_params().map(|p| bytes(&p.tensor)).sum(),
            grads: params.iter().map(|p| bytes(&p.tensor.grad())).sum(),
            optimizer: 0,
        };
        match &self.optimizer {
            Some(ModuleOptimizer::Distributed(o)) => {
                let (param_buffer, grad_buffer, sharded) = o.held_bytes();
                mem.params += param_buffer;
                mem.grads += grad_buffer;
                mem.optimizer = sharded;
            }
            Some(ModuleOptimizer::Replicated(o)) => {
                let (main, state) = o.owned_bytes();
                mem.optimizer = main + state;
            }
            None => {}
        }
        mem
    }

    /// Every parameter of the whole model as a full tensor with its Hugging Face name, on
    /// every rank (collective over TP and PP): what the rollout engine and `save_pretrained`
    /// take. The last stage's copy of a tied embedding is not listed.
    pub fn full_params(&self) -> Result<Vec<(String, Tensor)>> {
        let cfg = &self.model.config;
        let tp = self.tp();
        let pipe_group = self.groups.as_ref().and_then(|g| active(&g.pp));
        let stages = pipe_group.map_or(1, ProcessGroup::size);
        let layers = usize::try_from(cfg.num_hidden_layers)
            .map_err(|_| MegatronError::Config("negative layer count".into()))?;
        // This rank's parameters, and the other expert-parallel ranks' experts of its stage.
        let own: Vec<(String, Tensor)> = self
            .model
            .params()
            .into_iter()
            .filter(|p| !p.output_copy)
            .map(|p| (p.name, p.tensor))
            .collect();
        let mine: std::collections::HashMap<String, Tensor> =
            self.with_all_experts(own)?.into_iter().collect();
        let (kind, device) = (self.model.kind(), self.model.device());
        let mut out = Vec::new();
        for s in 0..stages {
            let stage = Stage::split(layers, s, stages)?;
            let shapes = self.model.stage_shapes(&stage);
            let mut tensors = Vec::with_capacity(shapes.len());
            for (name, shape) in &shapes {
                let t = if s == self.model.stage.rank {
                    let local = mine.get(name).ok_or_else(|| {
                        MegatronError::Config(format!("stage {s} lacks `{name}`"))
                    })?;
                    let full = gather_tensor(
                        &local.detach(),
                        self.model.shard_spec(name),
                        tp,
                        cfg.vocab_size,
                    )?;
                    // Replicated parameters (norms; everything without TP) come back as views
                    // of the live parameter: copy them, so what the caller keeps does not move
                    // with later updates.
                    if full.data_ptr() == local.data_ptr() {
                        full.f_detach_copy()?
                    } else {
                        full.f_contiguous()?
                    }
                } else {
                    Tensor::f_zeros(shape.as_slice(), (kind, device))?
                };
                tensors.push(t);
            }
            if let Some(pp) = pipe_group {
                pp.broadcast_many(&tensors, s)?;
            }
            out.extend(shapes.into_iter().map(|(n, _)| n).zip(tensors));
        }
        Ok(out)
    }
}

/// The schedule's view of a module's forward.
struct Step<'a, 'b> {
    model: &'a ParallelModel,
    mbs: &'a [MicroBatch],
    head: &'a mut HeadFn<'b>,
    scale: f64,
    /// Where the router losses' values of each forward go.
    router_values: &'a mut Vec<[f64; 2]>,
}

impl Step<'_, '_> {
    /// Micro-batch `mb`'s activations between stages, `width` wide: (B, this rank's share of
    /// T, width).
    fn activation_of(&self, mb: usize, width: i64) -> ActivationSpec {
        let size = self.mbs.get(mb).map_or(vec![0, 0], |m| m.input_ids.size());
        let dim = |i: usize| size.get(i).copied().unwrap_or(0);
        ActivationSpec {
            shape: vec![dim(0), dim(1) / self.model.sequence_parts(), width],
            kind: self.model.kind(),
            device: self.model.device(),
        }
    }
}

impl StageStep for Step<'_, '_> {
    fn activation(&self, mb: usize) -> ActivationSpec {
        self.activation_of(mb, self.model.activation_width())
    }

    fn output_activation(&self, mb: usize) -> ActivationSpec {
        self.activation_of(mb, self.model.output_width())
    }

    fn forward(&mut self, mb: usize, input: Option<Tensor>, tape: &mut Tape) -> Result<Tensor> {
        let m = self
            .mbs
            .get(mb)
            .ok_or_else(|| MegatronError::Config(format!("no micro-batch {mb}")))?;
        let input = match input {
            Some(h) => StageInput::Hidden(h),
            None => m.stage_input(),
        };
        // Router losses reach the gradient as Megatron's auxiliary-loss scaler adds them:
        // `1 / micro-batches` of each (times the loss scale), beside the normalised loss.
        tape.set_side_scale(self.scale / self.mbs.len().max(1) as f64);
        let hidden =
            self.model
                .forward_stage(tape, input, &m.position_ids, m.attention_mask.as_ref())?;
        self.router_values.extend_from_slice(tape.side_values());
        if !self.model.stage.is_last() {
            return Ok(hidden);
        }
        let out = (self.head)(mb, self.model, tape, &hidden)?;
        Ok(if self.scale != 1.0 {
            out * self.scale
        } else {
            out
        })
    }
}
