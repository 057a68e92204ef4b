//! The [`Regions`] of a Megatron rank: how the one decoder ([`crate::model::decoder`]) crosses
//! its tensor-parallel boundaries when its weights are this rank's shards.
//!
//! - [`TrainingRegions`]: Megatron's `f` / `g` (or, with sequence parallelism, the sequence
//!   all-gather / reduce-scatter) with the [`Tape`] that reverses them in the backward, and the
//!   residual stream cut between segments.
//! - [`InferenceRegions`]: the same values without a tape, for decoding under no-grad (the
//!   rollout on a Megatron rank).
use super::context::ContextParallel;
use crate::model::layers::{Linear, Regions};
use crate::model::moe::{RouterLossCoeffs, SparseMoe};
use crate::model::rank_group::RankGroup;
use crate::parallel::dist::ProcessGroup;
use crate::parallel::mappings::{
    Tape, copy_to_tp_region, gather_from_sequence_parallel_region, reduce_from_tp_region,
    reduce_scatter_to_sequence_parallel_region,
};
use tch::Tensor;

use super::{Result, TpError};

/// Sequence dim of hidden states (B, T, hidden).
pub const SEQ_DIM: i64 = 1;

/// A training forward on a rank's shards; see the module docs.
#[derive(Debug)]
pub struct TrainingRegions<'a> {
    pub tape: &'a mut Tape,
    pub tp: Option<&'a ProcessGroup>,
    /// The residual stream holds this rank's chunk of the sequence.
    pub sequence_parallel: bool,
    /// Context parallelism (a group of more than one rank, else `None`): the sequence is
    /// split over it and attention gathers every rank's keys and values
    /// (see [`super::context`]).
    pub cp: Option<&'a ContextParallel>,
    /// The router losses added to the gradient of mixture-of-experts layers (`None`: none).
    pub router: Option<RouterLossCoeffs>,
}

/// Dim of the positions in attention's keys and values (B, heads, T, D).
const KV_SEQ_DIM: i64 = 2;

impl Regions for TrainingRegions<'_> {
    type Error = TpError;

    fn cut(&mut self, x: &Tensor) -> Tensor {
        if self.tp.is_some() || self.cp.is_some() {
            self.tape.cut(x)
        } else {
            x.shallow_clone()
        }
    }

    fn enter(&mut self, x: Tensor) -> Result<Tensor> {
        if self.tp.is_none() && self.cp.is_some() {
            // The gathered keys' backward is a cut of its own: the segment it ends must not
            // share a node (the norm) with the queries' backward, which runs first.
            return Ok(self.tape.cut(&x));
        }
        if self.sequence_parallel {
            Ok(gather_from_sequence_parallel_region(
                self.tape, &x, self.tp, SEQ_DIM,
            )?)
        } else {
            Ok(copy_to_tp_region(self.tape, &x, self.tp))
        }
    }

    fn exit(&mut self, row: &Linear, x: &Tensor) -> Result<Tensor> {
        let y = self.reduce(row.partial(x))?;
        Ok(row.add_bias(y))
    }

    fn reduce(&mut self, partial: Tensor) -> Result<Tensor> {
        Ok(if self.sequence_parallel {
            reduce_scatter_to_sequence_parallel_region(self.tape, &partial, self.tp, SEQ_DIM)?
        } else {
            reduce_from_tp_region(&partial, self.tp)?
        })
    }

    fn experts(&mut self, moe: &SparseMoe, x: &Tensor, valid: Option<&Tensor>) -> Result<Tensor> {
        let tp = self.tp;
        let out = split_experts(self, moe, x, tp)?;
        if let Some(c) = self.router.filter(|c| c.any() && x.requires_grad()) {
            let cp = self.cp.map(|c| c.group() as &dyn RankGroup);
            let (balance, z) = moe.router_losses(x, valid, cp)?;
            // Every tensor rank routes the same tokens, and what the losses reach (the
            // router's weight, this segment's input) has its gradient summed over TP: each
            // rank adds 1/TP of them.
            let tp = self.tp.map_or(1, ProcessGroup::size) as f64;
            let term = (&balance * c.load_balancing + &z * c.z) / tp;
            let values = [balance.f_double_value(&[])?, z.f_double_value(&[])?];
            self.tape.add_side_loss(term, values);
        }
        Ok(out)
    }

    fn whole_sequences(
        &mut self,
        x: Tensor,
        valid: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let Some(cp) = self.cp else {
            return Ok((x, valid.map(Tensor::shallow_clone)));
        };
        let all = gather_from_sequence_parallel_region(self.tape, &x, Some(cp.group()), SEQ_DIM)?;
        let all = cp.in_sequence_order(&all, SEQ_DIM)?;
        // The mask needs no gradient.
        let valid = valid.map(|v| cp.gather(v, 1)).transpose()?;
        Ok((all, valid))
    }

    fn own_positions(&mut self, y: Tensor) -> Result<Tensor> {
        match self.cp {
            Some(cp) => cp.local(&y, SEQ_DIM),
            None => Ok(y),
        }
    }

    fn keys_values(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let Some(cp) = self.cp.map(ContextParallel::group) else {
            return Ok((k, v));
        };
        Ok((
            gather_from_sequence_parallel_region(self.tape, &k, Some(cp), KV_SEQ_DIM)?,
            gather_from_sequence_parallel_region(self.tape, &v, Some(cp), KV_SEQ_DIM)?,
        ))
    }
}

/// A forward without autograd on a rank's shards (decoding); see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct InferenceRegions<'a> {
    pub tp: Option<&'a ProcessGroup>,
}

impl Regions for InferenceRegions<'_> {
    type Error = TpError;

    fn enter(&mut self, x: Tensor) -> Result<Tensor> {
        Ok(x)
    }

    fn exit(&mut self, row: &Linear, x: &Tensor) -> Result<Tensor> {
        if row.lora.is_some() {
            // Adapters exist on whole layers only.
            return Ok(row.forward(x));
        }
        Ok(row.add_bias(reduce_from_tp_region(&row.partial(x), self.tp)?))
    }

    fn reduce(&mut self, partial: Tensor) -> Result<Tensor> {
        Ok(reduce_from_tp_region(&partial, self.tp)?)
    }

    fn experts(&mut self, moe: &SparseMoe, x: &Tensor, _valid: Option<&Tensor>) -> Result<Tensor> {
        let tp = self.tp;
        split_experts(self, moe, x, tp)
    }
}

/// A mixture-of-experts block on a Megatron rank of the tensor-parallel group `tp`: experts
/// split like dense MLPs (Megatron's expert tensor parallelism = TP) give this rank's weighted
/// partial outputs of all experts, reduced once over the group; whole experts under TP > 1
/// (expert TP 1) give this rank's share of the tokens, reduced the same way; an
/// expert-parallel group exchanges tokens inside the block.
fn split_experts<R: Regions<Error = TpError>>(
    regions: &mut R,
    moe: &SparseMoe,
    x: &Tensor,
    tp: Option<&ProcessGroup>,
) -> Result<Tensor> {
    if moe.is_split() {
        return regions.reduce(moe.try_partial(x)?);
    }
    match tp.filter(|g| g.size() > 1) {
        Some(g) => regions.reduce(moe.try_share(x, g.rank() as i64, g.size() as i64)?),
        None => Ok(moe.try_forward(x)?),
    }
}
