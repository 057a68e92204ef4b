//! What a layer asks of the ranks that split it: a mixture-of-experts block exchanges tokens
//! with the ranks that hold the other experts and sums its routing counts over the ranks that
//! split the sequences. The model names no process group: the parallel layer's groups
//! implement [`RankGroup`] (`crate::parallel::dist::ProcessGroup`), and the engines hand them
//! in as values.

use std::sync::Arc;

use tch::Tensor;

/// A collective of a [`RankGroup`] failed (its message says which and on which group).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CollectiveError(pub String);

/// The collectives a layer uses, over one group of ranks. Every rank of the group must make
/// the same calls in the same order.
pub trait RankGroup: std::fmt::Debug + Send + Sync {
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Sums `t` over the group, in place.
    fn sum_in_place(&self, t: &Tensor) -> Result<(), CollectiveError>;
    /// Every rank's `input`, stacked along a new first dimension of `output` in rank order.
    fn all_gather_into(&self, output: &Tensor, input: &Tensor) -> Result<(), CollectiveError>;
    /// The rows of `x` in blocks of `send[r]` rows, block r to rank r; the result joins the
    /// `recv[r]` rows received from each rank r in rank order. Differentiable: its gradient is
    /// the exchange back, so the group must outlive the autograd graph.
    fn all_to_all_rows(
        &self,
        x: &Tensor,
        send: &[i64],
        recv: &[i64],
    ) -> Result<Tensor, CollectiveError>;
}

/// A group as a layer holds it.
pub type SharedRankGroup = Arc<dyn RankGroup>;
