//! Context parallelism (Megatron's `context_parallel_size`): each sequence split over the
//! ranks of a CP group, so a rank's activations cover `1 / CP` of its positions.
//!
//! - **Load-balanced chunks** (Megatron's `get_batch_on_this_cp_rank`): a sequence of `T`
//!   positions (padded to a multiple of `2 * CP`) is cut into `2 * CP` equal chunks and rank
//!   `r` holds chunks `r` and `2 * CP - 1 - r`. Under a causal mask the early chunks attend to
//!   few keys and the late ones to many; pairing them gives every rank the same work.
//! - **Attention**: each layer's keys and values are all-gathered over the group (their
//!   gradients reduce-scattered back; [`crate::model::layers::Regions::keys_values`] of [`crate::parallel::tp::TrainingRegions`]), and the
//!   local queries attend to them under a mask built from true positions
//!   ([`ContextParallel::attention_mask`]).
//! - **Gated DeltaNet layers** (a recurrence along the sequence): the layer's input is
//!   all-gathered into sequence order, every rank runs the whole recurrence and keeps its own
//!   positions' outputs (the input's gradient reduce-scattered back;
//!   [`crate::model::layers::Regions::whole_sequences`] of [`crate::parallel::tp::TrainingRegions`]). Its parameters' gradients on a rank
//!   are those of its own positions' outputs, and the group's sum is the whole gradient, as
//!   for every other parameter. These layers' activations are not split (each rank holds
//!   whole sequences there); everything else in a layer is per token.
//! - **Heads**: log-probs and values are computed on the local positions and gathered into
//!   sequence order with a backward that keeps the local slice ([`ContextParallel::gather`]),
//!   so every rank computes the same loss and its backward reaches its own positions only;
//!   the gradients of the group's ranks are then summed
//!   ([`super::MegatronModule::finalize_grads`]), which gives the gradient of one process.
//!
//! The data split is unchanged: the CP ranks of one data-parallel rank take the same
//! micro-batches, as tensor-parallel ranks do.
use tch::{Device, Kind, Tensor};

use crate::parallel::dist::ProcessGroup;
use crate::parallel::mappings::gather_from_sequence_parallel_region_split_grad;

use super::{Result, TpError};

/// This rank's place in a context-parallel group of more than one rank.
#[derive(Debug, Clone)]
pub struct ContextParallel {
    group: ProcessGroup,
}

impl ContextParallel {
    /// `None` for a group of one (no context parallelism).
    pub fn new(group: &ProcessGroup) -> Option<Self> {
        (group.size() > 1).then(|| ContextParallel {
            group: group.clone(),
        })
    }

    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    pub fn size(&self) -> usize {
        self.group.size()
    }

    /// What a sequence length must be a multiple of (two chunks per rank).
    pub fn granule(&self) -> i64 {
        2 * self.size() as i64
    }

    /// The positions rank `rank` of `size` holds of a sequence of `t` (a multiple of
    /// `2 * size`), in the order it holds them: chunk `rank`, then chunk `2 * size - 1 - rank`.
    pub fn positions(t: i64, rank: usize, size: usize) -> Vec<i64> {
        let chunks = 2 * size as i64;
        let c = t / chunks;
        let (first, second) = (rank as i64, chunks - 1 - rank as i64);
        (first * c..(first + 1) * c)
            .chain(second * c..(second + 1) * c)
            .collect()
    }

    fn check_len(&self, t: i64) -> Result<()> {
        if t % self.granule() != 0 {
            return Err(TpError::Context(format!(
                "context parallel {}: a sequence of {t} positions is not a multiple of {}",
                self.size(),
                self.granule()
            )));
        }
        Ok(())
    }

    fn index(values: Vec<i64>, device: Device) -> Result<Tensor> {
        Ok(Tensor::from_slice(&values).f_to_device(device)?)
    }

    /// This rank's positions of `x` along `dim` (of length `t`, a multiple of
    /// [`granule`](Self::granule)).
    pub fn local(&self, x: &Tensor, dim: i64) -> Result<Tensor> {
        let t = len_at(x, dim)?;
        self.check_len(t)?;
        let idx = Self::index(
            Self::positions(t, self.group.rank(), self.size()),
            x.device(),
        )?;
        Ok(x.f_index_select(dim, &idx)?)
    }

    /// The positions of the gathered order (every rank's local positions, rank by rank).
    fn gathered_positions(&self, t: i64) -> Vec<i64> {
        (0..self.size())
            .flat_map(|r| Self::positions(t, r, self.size()))
            .collect()
    }

    /// `all`, every rank's positions gathered along `dim` rank by rank (`t` of them, a
    /// multiple of [`granule`](Self::granule)), in sequence order.
    pub fn in_sequence_order(&self, all: &Tensor, dim: i64) -> Result<Tensor> {
        let t = len_at(all, dim)?;
        self.check_len(t)?;
        // Sequence position p sits at gathered index inv[p].
        let mut inv = vec![0i64; usize::try_from(t).unwrap_or(0)];
        for (i, p) in self.gathered_positions(t).into_iter().enumerate() {
            if let Some(slot) = usize::try_from(p).ok().and_then(|p| inv.get_mut(p)) {
                *slot = i as i64;
            }
        }
        Ok(all.f_index_select(dim, &Self::index(inv, all.device())?)?)
    }

    /// Local values along `dim` (`t / CP` of them) gathered into sequence order (`t`); the
    /// gradient of the result reaches only this rank's positions (each rank computes the same
    /// function of the whole, see the module docs).
    pub fn gather(&self, x: &Tensor, dim: i64) -> Result<Tensor> {
        let all = gather_from_sequence_parallel_region_split_grad(x, Some(&self.group), dim)?;
        self.in_sequence_order(&all, dim)
    }

    /// The attention mask `(B, 1, T / CP, T)` of this rank's queries over the keys in gathered
    /// order (what [`crate::model::layers::Regions::keys_values`] of [`crate::parallel::tp::TrainingRegions`] yields): a key is seen when it
    /// is a real token (`valid` (B, T), 1 for real) at or before the query, and every query
    /// sees itself (so padded rows stay finite, as [`crate::model::causal_padding_mask`]).
    pub fn attention_mask(&self, valid: &Tensor) -> Result<Tensor> {
        let t = len_at(valid, 1)?;
        self.check_len(t)?;
        let device = valid.device();
        let q = Self::index(Self::positions(t, self.group.rank(), self.size()), device)?;
        let keys = self.gathered_positions(t);
        let k = Self::index(keys, device)?;
        let (q, k_row) = (q.f_view([-1, 1])?, k.f_view([1, -1])?);
        let causal = k_row.f_le_tensor(&q)?;
        let diag = k_row.f_eq_tensor(&q)?;
        let key_valid = valid
            .f_to_kind(Kind::Bool)?
            .f_index_select(1, &k)?
            .f_view([-1, 1, 1, t])?;
        Ok(causal.f_logical_and(&key_valid)?.f_logical_or(&diag)?)
    }
}

/// The size of `x` along `dim`.
fn len_at(x: &Tensor, dim: i64) -> Result<i64> {
    usize::try_from(dim)
        .ok()
        .and_then(|d| x.size().get(d).copied())
        .ok_or_else(|| {
            TpError::Context(format!("no dim {dim} in a tensor of shape {:?}", x.size()))
        })
}

#[cfg(test)]
mod tests {
    use super::ContextParallel;

    #[test]
    fn chunks_pair_early_and_late_positions() {
        // T = 8 over CP = 2: four chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1, 2.
        assert_eq!(ContextParallel::positions(8, 0, 2), vec![0, 1, 6, 7]);
        assert_eq!(ContextParallel::positions(8, 1, 2), vec![2, 3, 4, 5]);
        let mut all: Vec<i64> = (0..4)
            .flat_map(|r| ContextParallel::positions(16, r, 4))
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
    }
}
