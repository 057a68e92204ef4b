//! Tensor-parallel mappings (Megatron's `tensor_parallel/mappings.py`): pairs of collectives
//! whose forward and backward are mirror images.
//!
//! | function | forward | backward |
//! |---|---|---|
//! | [`copy_to_tp_region`] (Megatron's `f`) | identity | all-reduce |
//! | [`reduce_from_tp_region`] (`g`) | all-reduce | identity |
//! | [`scatter_to_tp_region`] | split last dim | all-gather last dim |
//! | [`gather_from_tp_region`] | all-gather last dim | split last dim |
//! | [`scatter_to_sequence_parallel_region`] | split sequence dim | all-gather |
//! | [`gather_from_sequence_parallel_region`] | all-gather sequence dim | reduce-scatter |
//! | [`gather_from_sequence_parallel_region_split_grad`] | all-gather sequence dim | split |
//! | [`reduce_scatter_to_sequence_parallel_region`] | reduce-scatter | all-gather |
//!
//! # Segment-wise backward (why there is a [`Tape`])
//!
//! tch has no custom autograd `Function`, so a collective cannot run *inside* libtorch's
//! backward pass. Two patterns replace it:
//!
//! - **Backward is local** (`g`, gather, and every vocab-parallel reduction): the forward
//!   communicates on a detached copy and re-attaches the local input with a zero-valued term,
//!   `out = collective(x.detach()) + (x - x.detach())` (or the gathered tensor with the local
//!   chunk put back in place). The value is exactly the collective's result (`x - x.detach()` is
//!   exactly zero), and the gradient reaching `x` is the identity (or the local slice), which is
//!   what these operators' backward is. No tape is needed.
//! - **Backward communicates** (`f`, scatter, the sequence-parallel all-gather): the graph is
//!   *cut*. The forward returns a fresh leaf `y` (requires grad) standing for the source `x`,
//!   and the [`Tape`] records `(x, y, collective)`. [`Tape::backward`] first back-propagates
//!   the root (the loss, or a pipeline stage's output with the gradient received from the
//!   next stage); the gradients stop at the leaves. It then walks the cuts in reverse
//!   creation order: the leaf's accumulated `.grad` goes through the cut's collective and is
//!   back-propagated from the source with [`crate::ops::backward`]. A cut's leaf can only
//!   receive gradient from computation done after it was created, so by the time it is
//!   reached every contribution has arrived.
//!
//! A segment's backward must not run twice over a shared subgraph, so a model using cuts also
//! cuts the residual stream next to them ([`Tape::cut`], identity both ways): then every
//! backward call covers only the operations between two cuts. A decoder layer under tensor
//! parallelism is four segments: `norm -> f`, `attention -> g -> +residual`, `norm -> f`,
//! `mlp -> g -> +residual`. Pipeline parallelism uses the same tape: a stage's input is a leaf
//! ([`Tape::input`]) whose gradient is sent to the previous stage after [`Tape::backward`].
//!
//! Every function takes the group as a value; `None` (or a group of one) is the identity.
use tch::Tensor;

use super::dist::{DistError, ProcessGroup, ReduceOp, Result};
use crate::ops;

fn torch(op: &'static str) -> impl Fn(tch::TchError) -> DistError {
    move |e| DistError::Collective {
        op,
        group: "local".into(),
        message: e.to_string(),
    }
}

fn autograd(e: ops::OpError) -> DistError {
    DistError::Collective {
        op: "backward",
        group: "autograd".into(),
        message: e.message,
    }
}

/// What a cut does to the gradient of its leaf before it reaches the source.
#[derive(Debug)]
enum GradOp {
    Identity,
    AllReduce(ProcessGroup),
    /// All-gather along `dim` (backward of a split).
    AllGather {
        group: ProcessGroup,
        dim: i64,
    },
    /// Reduce-scatter along `dim` (backward of an all-gather).
    ReduceScatter {
        group: ProcessGroup,
        dim: i64,
    },
}

#[derive(Debug)]
struct Cut {
    source: Tensor,
    leaf: Tensor,
    op: GradOp,
}

/// The cuts of one forward pass (one micro-batch on one pipeline stage); see the module docs.
/// It also carries the side losses of the pass (a mixture-of-experts router's load-balancing
/// and z-losses, which Megatron adds to the gradient without changing the reported loss):
/// they are back-propagated with the root, each with gradient [`Tape::set_side_scale`].
#[derive(Debug)]
pub struct Tape {
    cuts: Vec<Cut>,
    side: Vec<Tensor>,
    side_values: Vec<[f64; 2]>,
    side_scale: f64,
}

impl Default for Tape {
    fn default() -> Self {
        Tape {
            cuts: Vec::new(),
            side: Vec::new(),
            side_values: Vec::new(),
            side_scale: 1.0,
        }
    }
}

impl Tape {
    pub fn new() -> Self {
        Tape::default()
    }

    /// A loss term to back-propagate with the root (scaled by the side scale); `values` are
    /// what it reports (see [`Tape::side_values`]).
    pub fn add_side_loss(&mut self, loss: Tensor, values: [f64; 2]) {
        if loss.requires_grad() {
            self.side.push(loss);
        }
        self.side_values.push(values);
    }

    /// The gradient the side losses get (e.g. `1 / micro-batches`, times the loss scale).
    pub fn set_side_scale(&mut self, scale: f64) {
        self.side_scale = scale;
    }

    /// The values of the side losses recorded so far, in order.
    pub fn side_values(&self) -> &[[f64; 2]] {
        &self.side_values
    }

    /// Number of recorded cuts.
    pub fn len(&self) -> usize {
        self.cuts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cuts.is_empty()
    }

    /// A leaf for a tensor that has no graph upstream in this process (a pipeline stage's
    /// received activations): it requires grad, so its `.grad` holds the gradient to send back
    /// after [`Tape::backward`]. Not recorded.
    pub fn input(&mut self, x: &Tensor) -> Tensor {
        x.detach().set_requires_grad(true)
    }

    /// Identity both ways; splits the graph so that segments are back-propagated one at a
    /// time. Returns `x` itself when it does not require grad (inference).
    pub fn cut(&mut self, x: &Tensor) -> Tensor {
        self.record(x, x.detach(), GradOp::Identity)
    }

    fn record(&mut self, source: &Tensor, value: Tensor, op: GradOp) -> Tensor {
        if !source.requires_grad() {
            return value;
        }
        let leaf = value.set_requires_grad(true);
        self.cuts.push(Cut {
            source: source.shallow_clone(),
            leaf: leaf.shallow_clone(),
            op,
        });
        leaf
    }

    /// Back-propagates `root` (a scalar loss when `grad` is `None`, else with gradient `grad`)
    /// and then every cut in reverse order, running each cut's collective on the way. Param
    /// gradients accumulate in their `.grad`. The tape is emptied.
    pub fn backward(&mut self, root: &Tensor, grad: Option<&Tensor>) -> Result<()> {
        let err = torch("backward");
        let (mut roots, mut grads) = (Vec::new(), Vec::new());
        if root.requires_grad() {
            grads.push(match grad {
                Some(g) => g.shallow_clone(),
                None => root.ones_like(),
            });
            roots.push(root.shallow_clone());
        }
        for side in std::mem::take(&mut self.side) {
            grads.push(side.f_full_like(self.side_scale).map_err(&err)?);
            roots.push(side);
        }
        if !roots.is_empty() {
            ops::backward(&roots, &grads, false).map_err(autograd)?;
        }
        while let Some(cut) = self.cuts.pop() {
            let g = cut.leaf.grad();
            if !g.defined() {
                continue; // nothing downstream used this leaf
            }
            let g = match &cut.op {
                GradOp::Identity => g,
                GradOp::AllReduce(group) => {
                    let g = g.f_contiguous().map_err(&err)?;
                    group.all_reduce(&g, ReduceOp::Sum)?;
                    g
                }
                GradOp::AllGather { group, dim } => all_gather_dim(&g, group, *dim)?,
                GradOp::ReduceScatter { group, dim } => reduce_scatter_dim(&g, group, *dim)?,
            };
            ops::set_grad(&cut.leaf, None).map_err(autograd)?;
            ops::backward(&[cut.source], &[g], false).map_err(autograd)?;
        }
        Ok(())
    }
}

/// A contiguous copy of `x`'s value in new memory, without history.
fn fresh_copy(x: &Tensor) -> std::result::Result<Tensor, tch::TchError> {
    let mut out = Tensor::f_empty(x.size().as_slice(), (x.kind(), x.device()))?;
    out.f_copy_(&x.detach())?;
    Ok(out)
}

fn active(group: Option<&ProcessGroup>) -> Option<&ProcessGroup> {
    group.filter(|g| g.size() > 1)
}

/// `x` with a zero-valued term that routes the gradient of `value` to `x` unchanged:
/// `value + (x - x.detach())`, exact in value.
fn reattach(value: Tensor, x: &Tensor) -> Result<Tensor> {
    if !x.requires_grad() {
        return Ok(value);
    }
    let zero = x.f_sub(&x.detach()).map_err(torch("reattach"))?;
    value.f_add(&zero).map_err(torch("reattach"))
}

/// Megatron's `f`: identity forward, all-reduce (sum) of the gradient over `group` backward.
/// Inputs of column-parallel layers pass through this once (q, k and v share one copy).
pub fn copy_to_tp_region(tape: &mut Tape, x: &Tensor, group: Option<&ProcessGroup>) -> Tensor {
    match active(group) {
        Some(g) => tape.record(x, x.detach(), GradOp::AllReduce(g.clone())),
        None => x.shallow_clone(),
    }
}

/// Megatron's `g`: all-reduce (sum) forward, identity backward. Outputs of row-parallel
/// layers and of the vocab-parallel embedding pass through this.
pub fn reduce_from_tp_region(x: &Tensor, group: Option<&ProcessGroup>) -> Result<Tensor> {
    let Some(g) = active(group) else {
        return Ok(x.shallow_clone());
    };
    // A copy: the collective works in place and `x` must keep its value.
    let sum = fresh_copy(x).map_err(torch("reduce_from_tp_region"))?;
    g.all_reduce(&sum, ReduceOp::Sum)?;
    reattach(sum, x)
}

/// All-reduce with MAX of a tensor that needs no gradient (e.g. a softmax shift).
pub fn max_over(x: &Tensor, group: Option<&ProcessGroup>) -> Result<Tensor> {
    let out = fresh_copy(x).map_err(torch("max_over"))?;
    if let Some(g) = active(group) {
        g.all_reduce(&out, ReduceOp::Max)?;
    }
    Ok(out)
}

/// Split along `dim` into `group.size()` equal chunks and keep this rank's (a view).
fn split_dim(x: &Tensor, group: &ProcessGroup, dim: i64) -> Result<Tensor> {
    let size = x.size();
    let d = norm_dim(dim, size.len())?;
    let n = size[d];
    let w = group.size() as i64;
    if n % w != 0 {
        return Err(DistError::Invalid(format!(
            "cannot split dim {dim} of size {n} into {w} equal chunks"
        )));
    }
    x.f_narrow(d as i64, group.rank() as i64 * (n / w), n / w)
        .map_err(torch("split"))
}

fn norm_dim(dim: i64, rank: usize) -> Result<usize> {
    let d = if dim < 0 { dim + rank as i64 } else { dim };
    if d < 0 || d >= rank as i64 {
        return Err(DistError::Invalid(format!(
            "dim {dim} out of range for a {rank}-d tensor"
        )));
    }
    Ok(d as usize)
}

/// All-gather along `dim` (rank-major), a fresh tensor without autograd history.
pub fn all_gather_dim(x: &Tensor, group: &ProcessGroup, dim: i64) -> Result<Tensor> {
    let e = torch("all_gather");
    let size = x.size();
    let d = norm_dim(dim, size.len())?;
    let w = group.size() as i64;
    let input = x.detach().f_contiguous().map_err(&e)?;
    let mut full = vec![w];
    full.extend_from_slice(&size);
    let out = Tensor::f_empty(full.as_slice(), (x.kind(), x.device())).map_err(&e)?;
    group.all_gather_into(&out, &input)?;
    let parts = out.f_unbind(0).map_err(&e)?;
    Tensor::f_cat(&parts, d as i64).map_err(&e)
}

/// Sum over the group, then keep this rank's chunk along `dim`; no autograd history.
pub fn reduce_scatter_dim(x: &Tensor, group: &ProcessGroup, dim: i64) -> Result<Tensor> {
    let e = torch("reduce_scatter");
    let size = x.size();
    let d = norm_dim(dim, size.len())?;
    let w = group.size() as i64;
    if size[d] % w != 0 {
        return Err(DistError::Invalid(format!(
            "cannot reduce-scatter dim {dim} of size {} over {w} ranks",
            size[d]
        )));
    }
    let chunks = x.detach().f_chunk(w, d as i64).map_err(&e)?;
    let input = Tensor::f_stack(&chunks, 0)
        .map_err(&e)?
        .f_contiguous()
        .map_err(&e)?;
    let out = Tensor::f_empty(chunks[0].size().as_slice(), (x.kind(), x.device())).map_err(&e)?;
    group.reduce_scatter(&out, &input, ReduceOp::Sum)?;
    Ok(out)
}

/// Split the last dim forward (local), all-gather the gradient backward.
pub fn scatter_to_tp_region(
    tape: &mut Tape,
    x: &Tensor,
    group: Option<&ProcessGroup>,
) -> Result<Tensor> {
    let Some(g) = active(group) else {
        return Ok(x.shallow_clone());
    };
    let part = split_dim(&x.detach(), g, -1)?
        .f_contiguous()
        .map_err(torch("scatter"))?;
    Ok(tape.record(
        x,
        part,
        GradOp::AllGather {
            group: g.clone(),
            dim: -1,
        },
    ))
}

/// All-gather the last dim forward; the gradient's local slice backward (no tape needed).
pub fn gather_from_tp_region(x: &Tensor, group: Option<&ProcessGroup>) -> Result<Tensor> {
    gather_local_backward(x, group, -1)
}

fn gather_local_backward(x: &Tensor, group: Option<&ProcessGroup>, dim: i64) -> Result<Tensor> {
    let Some(g) = active(group) else {
        return Ok(x.shallow_clone());
    };
    let e = torch("gather");
    let full = all_gather_dim(x, g, dim)?;
    if !x.requires_grad() {
        return Ok(full);
    }
    // Put the local chunk back with its history: the value is unchanged, and the gradient
    // of the output's local slice reaches `x`.
    let d = norm_dim(dim, x.size().len())? as i64;
    let n = x.size()[d as usize];
    let mut parts = full.f_split(n, d).map_err(&e)?;
    let r = g.rank();
    parts[r] = reattach(parts[r].shallow_clone(), x)?;
    Tensor::f_cat(&parts, d).map_err(&e)
}

/// Sequence parallelism: keep this rank's chunk of the sequence dim `dim` forward, all-gather
/// the gradient backward.
pub fn scatter_to_sequence_parallel_region(
    tape: &mut Tape,
    x: &Tensor,
    group: Option<&ProcessGroup>,
    dim: i64,
) -> Result<Tensor> {
    let Some(g) = active(group) else {
        return Ok(x.shallow_clone());
    };
    let part = split_dim(&x.detach(), g, dim)?
        .f_contiguous()
        .map_err(torch("scatter"))?;
    Ok(tape.record(
        x,
        part,
        GradOp::AllGather {
            group: g.clone(),
            dim,
        },
    ))
}

/// Sequence parallelism: all-gather the sequence dim forward (before a column-parallel
/// layer), reduce-scatter the gradient backward.
pub fn gather_from_sequence_parallel_region(
    tape: &mut Tape,
    x: &Tensor,
    group: Option<&ProcessGroup>,
    dim: i64,
) -> Result<Tensor> {
    let Some(g) = active(group) else {
        return Ok(x.shallow_clone());
    };
    let full = all_gather_dim(x, g, dim)?;
    Ok(tape.record(
        x,
        full,
        GradOp::ReduceScatter {
            group: g.clone(),
            dim,
        },
    ))
}

/// Sequence parallelism: all-gather the sequence dim forward for a consumer whose gradient is
/// the same on every rank (a replicated layer), so the backward keeps this rank's chunk of it
/// (Megatron's `gather_from_sequence_parallel_region(tensor_parallel_output_grad=False)`).
pub fn gather_from_sequence_parallel_region_split_grad(
    x: &Tensor,
    group: Option<&ProcessGroup>,
    dim: i64,
) -> Result<Tensor> {
    gather_local_backward(x, group, dim)
}

/// Sequence parallelism: reduce-scatter forward (after a row-parallel layer), all-gather the
/// gradient backward.
pub fn reduce_scatter_to_sequence_parallel_region(
    tape: &mut Tape,
    x: &Tensor,
    group: Option<&ProcessGroup>,
    dim: i64,
) -> Result<Tensor> {
    let Some(g) = active(group) else {
        return Ok(x.shallow_clone());
    };
    let part = reduce_scatter_dim(x, g, dim)?;
    Ok(tape.record(
        x,
        part,
        GradOp::AllGather {
            group: g.clone(),
            dim,
        },
    ))
}

/// Sum of a scalar-per-row statistic over the group with identity backward, for several
/// tensors at once (one collective): the vocab-parallel reductions use this.
pub fn reduce_many_from_tp_region(
    xs: &[Tensor],
    group: Option<&ProcessGroup>,
) -> Result<Vec<Tensor>> {
    let Some(g) = active(group) else {
        return Ok(xs.iter().map(Tensor::shallow_clone).collect());
    };
    let e = torch("reduce_many_from_tp_region");
    let sums: Vec<Tensor> = xs
        .iter()
        .map(fresh_copy)
        .collect::<std::result::Result<_, _>>()
        .map_err(&e)?;
    g.all_reduce_many(&sums, ReduceOp::Sum)?;
    sums.into_iter()
        .zip(xs)
        .map(|(s, x)| reattach(s, x))
        .collect()
}
