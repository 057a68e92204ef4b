//! Megatron's `DistributedOptimizer` (ZeRO-1): main params and optimizer state sharded over
//! the data-parallel ranks, on the contiguous-buffer [`layout`] of
//! docs/optimizer.md.
//!
//! One step ([`DistributedOptimizer::step`]):
//! 1. the model grads are copied into the fp32 grad buffer (zeros where a param has none and
//!    in the padding) and scaled by `1/dp` (Megatron's `gradient_scaling_factor`);
//! 2. each bucket is reduce-scattered over the DP group: rank `r` gets the summed shard `r`;
//! 3. the inner [`Optimizer`] steps the owned pieces: every owned range of a param is one
//!    fp32 main tensor whose grad is a view of the shard. Found-inf and the grad norm are
//!    reduced over the `stats` group (every rank of the job: shards are disjoint over DP,
//!    stages over PP; TP duplicates and the shared-embedding copy are left out of the norm
//!    with [`DistParam::in_grad_norm`]). Clipping, skipping, scalers, host offload of a
//!    fraction of the state and checkpoints are the inner optimizer's;
//! 4. the updated pieces are written (cast to the model dtype) into the param buffer and each
//!    bucket is all-gathered over DP.
//!
//! As in Megatron, the model params *are* views of the param buffer (their data is rebound to
//! it when the optimizer is built), so the weights are held once and the all-gather updates
//! the model. fp32 models step in place: a piece's main tensor is a view of the buffer too.
//! bf16/fp16 models keep separate fp32 pieces.
//!
//! Under expert parallelism (as Megatron's expert buffers) the routed experts' params are a
//! second [`BufferSet`], sharded over the ranks that hold the same experts (expert-DP): each
//! expert's gradient already holds every token of its expert-parallel group, so summed over
//! expert-DP and scaled by `1/dp` it is the data-parallel average dense params get. The pieces
//! of both sets are stepped by one inner optimizer (one norm, one clip, one found-inf).
pub mod layout;

use std::path::Path;

use tch::{Kind, Tensor};

pub use layout::{LayoutOptions, OwnedRange, ParamIndex, ParamLayout, ParamSpec};

use super::param_groups::{NamedParam, ParamGroup};
use super::{LossScaling, OptimError, Optimizer, OptimizerConfig, Result, StepOutcome};
use crate::ops;
use crate::parallel::dist::{ProcessGroup, ReduceOp};

/// A model param handed to the distributed optimizer, in model order.
#[derive(Debug)]
pub struct DistParam {
    pub name: String,
    pub tensor: Tensor,
    /// Isolated in its own bucket (tied embedding / output weight across pipeline stages).
    pub shared_embedding: bool,
    /// Counted in the grad norm (false for TP duplicates on TP rank > 0 and for the output
    /// copy of a shared embedding).
    pub in_grad_norm: bool,
    /// Gets Megatron's `decoupled_lr` (embedding and output layer).
    pub is_embedding_or_output: bool,
}

/// The groups the distributed optimizer talks to.
#[derive(Debug, Clone, Default)]
pub struct DistGroups {
    /// Data-parallel group the state is sharded over (`None`: one rank).
    pub dp: Option<ProcessGroup>,
    /// Group of found-inf and grad-norm reductions: every rank of the job.
    pub stats: Option<ProcessGroup>,
    /// Expert parallelism: where the experts' params are sharded instead of `dp`.
    pub experts: Option<ExpertSharding>,
    /// The data-parallel replicas gradients are averaged over when `dp` holds more ranks
    /// than that (under context parallelism it is DP x CP, whose CP ranks' gradients are
    /// parts of one replica's and are summed); `None`: `dp`'s size.
    pub replicas: Option<usize>,
}

/// The expert params' sharding (see the module docs).
#[derive(Debug, Clone)]
pub struct ExpertSharding {
    /// The ranks that hold the same experts (expert-DP).
    pub group: ProcessGroup,
    /// Which params (by name) are experts.
    pub is_expert: fn(&str) -> bool,
}

/// One owned piece: a model param's slice and its fp32 main tensor.
struct Piece {
    range: OwnedRange,
    /// fp32 leaf the inner optimizer steps (a view of the param buffer for fp32 models).
    main: Tensor,
    /// View of the reduce-scattered grad shard.
    grad: Tensor,
    aliased: bool,
}

/// Params sharded over one group: their contiguous buffers, this rank's shard and pieces.
struct BufferSet {
    params: Vec<(String, Tensor)>,
    layout: ParamLayout,
    /// The group the state is sharded over (`None`: one rank holds all of it).
    group: Option<ProcessGroup>,
    rank: usize,
    /// Applied to the gradients before they are summed over `group`: `1/dp`.
    grad_scale: f64,
    /// Model dtype, whole layout.
    param_buffer: Tensor,
    /// fp32, whole layout.
    grad_buffer: Tensor,
    /// fp32, this rank's shard of every bucket, concatenated.
    shard_grads: Tensor,
    /// Offset of each bucket's shard in `shard_grads`.
    shard_offsets: Vec<i64>,
    pieces: Vec<Piece>,
}

/// Megatron's distributed optimizer; see the module docs.
pub struct DistributedOptimizer {
    /// The dense params' set, then (under expert parallelism) the experts'.
    sets: Vec<BufferSet>,
    groups: DistGroups,
    inner: Optimizer,
}

impl std::fmt::Debug for DistributedOptimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedOptimizer")
            .field(
                "params",
                &self.sets.iter().map(|s| s.params.len()).sum::<usize>(),
            )
            .field("layout", &self.layout())
            .field("sets", &self.sets.len())
            .finish_non_exhaustive()
    }
}

fn idx(r: usize) -> i64 {
    r as i64
}

fn active(g: Option<&ProcessGroup>) -> Option<&ProcessGroup> {
    g.filter(|g| g.size() > 1)
}

impl BufferSet {
    /// Lays out `params` (all of `kind` on `device`), rebinds them to the param buffer and
    /// cuts this rank's pieces.
    fn new(
        params: &[&DistParam],
        group: Option<ProcessGroup>,
        grad_scale: f64,
        layout_opts: LayoutOptions,
        (kind, device): (Kind, tch::Device),
    ) -> Result<Self> {
        let (rank, size) = group.as_ref().map_or((0, 1), |g| (g.rank(), g.size()));
        let specs: Vec<ParamSpec> = params
            .iter()
            .map(|p| ParamSpec {
                numel: p.tensor.numel(),
                shared_embedding: p.shared_embedding,
            })
            .collect();
        let layout = ParamLayout::new(&specs, size, layout_opts);
        let total = idx(layout.numel());
        let param_buffer = Tensor::f_zeros([total], (kind, device))?;
        let grad_buffer = Tensor::f_zeros([total], (Kind::Float, device))?;
        let mut shard_offsets = Vec::with_capacity(layout.buckets.len());
        let mut acc = 0i64;
        for b in 0..layout.buckets.len() {
            shard_offsets.push(acc);
            acc += idx(layout.shard_size(b));
        }
        let shard_grads = Tensor::f_zeros([acc], (Kind::Float, device))?;
        // Model params into the buffer, then the params become views of it.
        tch::no_grad(|| -> Result<()> {
            for (p, ix) in params.iter().zip(&layout.index) {
                let mut view = param_buffer.f_narrow(0, idx(ix.start), idx(ix.end - ix.start))?;
                view.f_copy_(&p.tensor.f_detach()?.f_reshape([-1])?)?;
                p.tensor
                    .shallow_clone()
                    .f_set_data(&view.f_view(p.tensor.size().as_slice())?)?;
            }
            Ok(())
        })?;
        let mut pieces = Vec::new();
        for range in layout.owned(rank) {
            let world = &range.gbuf_world;
            let len = idx(world.end - world.start);
            let model_view = param_buffer.f_narrow(0, idx(world.start), len)?;
            let aliased = kind == Kind::Float;
            let main = if aliased {
                model_view.f_detach()?
            } else {
                model_view.f_to_kind(Kind::Float)?.f_detach()?
            };
            let main = main.set_requires_grad(true);
            let local = shard_offsets[range.bucket] + idx(range.gbuf_local.start);
            let grad = shard_grads.f_narrow(0, local, len)?;
            pieces.push(Piece {
                range,
                main,
                grad,
                aliased,
            });
        }
        Ok(BufferSet {
            params: params
                .iter()
                .map(|p| (p.name.clone(), p.tensor.shallow_clone()))
                .collect(),
            layout,
            group,
            rank,
            grad_scale,
            param_buffer,
            grad_buffer,
            shard_grads,
            shard_offsets,
            pieces,
        })
    }

    fn zero_grad(&self) -> Result<()> {
        for (_, t) in &self.params {
            ops::set_grad(t, None)?;
        }
        Ok(())
    }

    /// Steps 1–2: model grads into the buffer, scaled, reduce-scattered per bucket.
    fn reduce_scatter_grads(&mut self) -> Result<()> {
        let _ = self.grad_buffer.f_zero_()?;
        tch::no_grad(|| -> Result<()> {
            let mut dst = Vec::new();
            let mut src = Vec::new();
            for ((_, t), ix) in self.params.iter().zip(&self.layout.index) {
                let g = t.grad();
                if g.defined() {
                    dst.push(self.grad_buffer.f_narrow(
                        0,
                        idx(ix.start),
                        idx(ix.end - ix.start),
                    )?);
                    src.push(g.f_reshape([-1])?);
                }
            }
            ops::foreach_copy(&dst, &src, false)?;
            Ok(())
        })?;
        self.zero_grad()?;
        if self.grad_scale != 1.0 {
            let _ = self.grad_buffer.f_mul_scalar_(self.grad_scale)?;
        }
        let Some(group) = active(self.group.as_ref()) else {
            // One rank: its shard is the whole buffer.
            self.shard_grads.f_copy_(&self.grad_buffer)?;
            return Ok(());
        };
        for (b, bucket) in self.layout.buckets.iter().enumerate() {
            let input = self
                .grad_buffer
                .f_narrow(0, idx(bucket.start), idx(bucket.len()))?;
            let out = self.shard_grads.f_narrow(
                0,
                self.shard_offsets[b],
                idx(self.layout.shard_size(b)),
            )?;
            group.reduce_scatter(&out, &input, ReduceOp::Sum)?;
        }
        Ok(())
    }

    /// Step 4: pieces into the param buffer (the model params view it), all-gather per bucket.
    fn gather_params(&mut self) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for p in self.pieces.iter().filter(|p| !p.aliased) {
                let w = &p.range.gbuf_world;
                let mut view = self.param_buffer.f_narrow(0, idx(w.start), idx(w.len()))?;
                view.f_copy_(&p.main)?;
            }
            if let Some(group) = active(self.group.as_ref()) {
                for b in 0..self.layout.buckets.len() {
                    let bucket = &self.layout.buckets[b];
                    let out =
                        self.param_buffer
                            .f_narrow(0, idx(bucket.start), idx(bucket.len()))?;
                    let own = self.layout.shard_range(b, self.rank);
                    // A separate input: Gloo's all-gather may not take an input inside its output.
                    let own = self
                        .param_buffer
                        .f_narrow(0, idx(own.start), idx(own.len()))?;
                    let mut input =
                        Tensor::f_empty([own.numel() as i64], (own.kind(), own.device()))?;
                    input.f_copy_(&own)?;
                    group.all_gather_into(&out, &input)?;
                }
            }
            Ok(())
        })
    }

    /// Refreshes the unaliased main pieces from the param buffer.
    fn reload(&self) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            for p in self.pieces.iter().filter(|p| !p.aliased) {
                let w = &p.range.gbuf_world;
                let mut main = p.main.f_detach()?;
                main.f_copy_(&self.param_buffer.f_narrow(0, idx(w.start), idx(w.len()))?)?;
            }
            Ok(())
        })
    }
}

impl DistributedOptimizer {
    /// Lays out `params` (model order, all of one dtype and device), shards them over
    /// `groups.dp` (the experts over `groups.experts`' group), and builds the inner optimizer
    /// over this rank's pieces. `make_groups` receives the *model* params (so rules on shapes
    /// and names see the real params) and returns the param groups; each group then holds the
    /// pieces of its params.
    pub fn new(
        params: Vec<DistParam>,
        make_groups: impl FnOnce(Vec<NamedParam>) -> Vec<ParamGroup>,
        config: OptimizerConfig,
        groups: DistGroups,
        layout_opts: LayoutOptions,
        scaling: LossScaling,
    ) -> Result<Self> {
        let params: Vec<DistParam> = params
            .into_iter()
            .filter(|p| p.tensor.requires_grad())
            .collect();
        let Some(first) = params.first() else {
            return Err(OptimError::Config(
                "the distributed optimizer got no trainable params".into(),
            ));
        };
        let (kind, device) = (first.tensor.kind(), first.tensor.device());
        if let Some(p) = params
            .iter()
            .find(|p| p.tensor.kind() != kind || p.tensor.device() != device)
        {
            return Err(OptimError::Config(format!(
                "param {} is {:?} on {:?}; the buffer holds {kind:?} on {device:?}",
                p.name,
                p.tensor.kind(),
                p.tensor.device()
            )));
        }
        let dp_size = groups.dp.as_ref().map_or(1, ProcessGroup::size);
        let scale = 1.0 / groups.replicas.unwrap_or(dp_size).max(1) as f64;
        let is_expert = |p: &DistParam| {
            groups
                .experts
                .as_ref()
                .is_some_and(|e| (e.is_expert)(&p.name))
        };
        let dense: Vec<&DistParam> = params.iter().filter(|p| !is_expert(p)).collect();
        let experts: Vec<&DistParam> = params.iter().filter(|p| is_expert(p)).collect();
        let mut sets = vec![BufferSet::new(
            &dense,
            groups.dp.clone(),
            scale,
            layout_opts,
            (kind, device),
        )?];
        if let (Some(e), false) = (&groups.experts, experts.is_empty()) {
            sets.push(BufferSet::new(
                &experts,
                Some(e.group.clone()),
                scale,
                layout_opts,
                (kind, device),
            )?);
        }
        // Groups over the model params, then over the pieces.
        let named: Vec<NamedParam> = params
            .iter()
            .map(|p| NamedParam {
                name: p.name.clone(),
                tensor: p.tensor.shallow_clone(),
                is_embedding_or_output: p.is_embedding_or_output,
                in_grad_norm: p.in_grad_norm,
            })
            .collect();
        let model_groups = make_groups(named);
        let mut piece_of = std::collections::HashMap::new();
        for set in &sets {
            for piece in &set.pieces {
                piece_of.insert(
                    set.params[piece.range.param].0.clone(),
                    piece.main.shallow_clone(),
                );
            }
        }
        let mut inner_groups = Vec::with_capacity(model_groups.len());
        for g in model_groups {
            let mut members = Vec::new();
            for p in g.params {
                if let Some(main) = piece_of.get(&p.name) {
                    members.push(NamedParam {
                        name: p.name,
                        tensor: main.shallow_clone(),
                        is_embedding_or_output: p.is_embedding_or_output,
                        in_grad_norm: p.in_grad_norm,
                    });
                }
            }
            inner_groups.push(ParamGroup {
                params: members,
                options: g.options,
            });
        }
        let inner = Optimizer::with_scaling(inner_groups, config, scaling)?;
        Ok(DistributedOptimizer {
            sets,
            groups,
            inner,
        })
    }

    /// The dense params' layout.
    pub fn layout(&self) -> &ParamLayout {
        &self.sets[0].layout
    }

    /// The inner optimizer over this rank's pieces (its options are what schedulers write).
    pub fn inner(&self) -> &Optimizer {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut Optimizer {
        &mut self.inner
    }

    /// `(param name, param slice, fp32 main tensor)` of every piece this rank owns.
    pub fn owned_main_params(&self) -> Vec<(String, std::ops::Range<usize>, Tensor)> {
        self.sets
            .iter()
            .flat_map(|s| {
                s.pieces.iter().map(|p| {
                    (
                        s.params[p.range.param].0.clone(),
                        p.range.param_range.clone(),
                        p.main.shallow_clone(),
                    )
                })
            })
            .collect()
    }

    /// The model-dtype buffers of the whole layouts (what parameter offload moves with the
    /// parameters; fp32 pieces are views of them).
    pub fn param_buffers(&self) -> impl Iterator<Item = &Tensor> {
        self.sets.iter().map(|s| &s.param_buffer)
    }

    /// The fp32 grad buffers of the whole layouts and the reduce-scattered shards (what
    /// gradient offload moves; the pieces' grads are views of the shards).
    pub fn grad_buffers(&self) -> impl Iterator<Item = &Tensor> {
        self.sets
            .iter()
            .flat_map(|s| [&s.grad_buffer, &s.shard_grads])
    }

    /// Bytes this optimizer holds, as `(param_buffer, grad_buffer, sharded)`: the model-dtype
    /// and fp32 buffers of the whole layouts (this rank's part of the model, for the bucket
    /// collectives), and what is split over the data-parallel group: the reduce-scattered grad
    /// shards, the fp32 main pieces that are not views of the param buffers, and the inner
    /// optimizer's state.
    pub fn held_bytes(&self) -> (i64, i64, i64) {
        let bytes = ops::tensor_bytes;
        let mut out = (0, 0, 0);
        for s in &self.sets {
            let mains: i64 = s
                .pieces
                .iter()
                .filter(|p| !p.aliased)
                .map(|p| bytes(&p.main))
                .sum();
            out.0 += bytes(&s.param_buffer);
            out.1 += bytes(&s.grad_buffer);
            out.2 += bytes(&s.shard_grads) + mains;
        }
        let (flat, state) = self.inner.owned_bytes();
        out.2 += flat + state;
        out
    }

    /// Elements of main params / state this rank holds.
    pub fn owned_numel(&self) -> usize {
        self.sets
            .iter()
            .flat_map(|s| &s.pieces)
            .map(|p| p.range.gbuf_local.len())
            .sum()
    }

    /// Releases every model grad.
    pub fn zero_grad(&mut self) -> Result<()> {
        for s in &self.sets {
            s.zero_grad()?;
        }
        Ok(())
    }

    /// Loss scale to multiply the loss with before backward (1 without a scaler).
    pub fn loss_scale(&self) -> f64 {
        self.inner.loss_scale()
    }

    /// Reduce-scatter, step, all-gather; see the module docs. The model grads are consumed.
    pub fn step(&mut self) -> Result<StepOutcome> {
        for s in &mut self.sets {
            s.reduce_scatter_grads()?;
            for p in &s.pieces {
                ops::set_grad(&p.main, Some(&p.grad))?;
            }
        }
        let outcome = self.inner.step(self.groups.stats.as_ref())?;
        self.inner.zero_grad()?;
        if outcome.update_successful {
            self.gather_params()?;
        }
        Ok(outcome)
    }

    fn gather_params(&mut self) -> Result<()> {
        for s in &mut self.sets {
            s.gather_params()?;
        }
        Ok(())
    }

    /// Whether the model param `name` is one of this optimizer's (a view of its buffers).
    pub fn binds(&self, name: &str) -> bool {
        self.sets
            .iter()
            .any(|s| s.params.iter().any(|(n, _)| n == name))
    }

    /// Refreshes the main pieces from the model params (after loading weights into them, that
    /// is into the buffers).
    pub fn reload_model_params(&mut self) -> Result<()> {
        for s in &self.sets {
            s.reload()?;
        }
        self.inner.reload_model_params()
    }

    /// Writes this rank's pieces and their state (one file per rank; the layout must match
    /// on load: same model, DP size and bucket options).
    pub fn save(&self, path: &Path) -> Result<()> {
        self.inner.save(path)
    }

    /// Restores what [`save`](Self::save) wrote on this rank, then rebuilds the model params
    /// from every rank's pieces (collective over DP).
    pub fn load(&mut self, path: &Path) -> Result<()> {
        self.inner.load(path)?;
        self.gather_params()
    }
}
