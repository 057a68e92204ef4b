//! [`FsdpHead`]: what the FSDP engine needs from a [`Head`] to run it unit by unit, beyond the
//! backbone: whether the head reads the embedding matrix, and the head's output from the final
//! hidden states of the response window, through the head's own per-token columns
//! ([`Head::token_columns`]).

use tch::Tensor;

use crate::engine::{Batch, EngineError, ForwardOptions, Head, Result, lengths, topk_targets};
use crate::model::{CausalLm, ValueModel};

/// A head the FSDP engine can run segment by segment.
pub trait FsdpHead: Head {
    /// Whether the head reads the embedding matrix (tied embeddings).
    fn reads_embedding(&self) -> bool;
    /// The head's output from the normed final hidden states `(N, R, hidden)` of the positions
    /// that predict the `R` response tokens of `batch` (`[T - R - 1, T - 1)`), the window the
    /// engine's last layer computes ([`crate::model::decoder::Model::forward_window`]): the
    /// head's per-token columns on that grid.
    fn output_from_window(
        &self,
        hidden: &Tensor,
        batch: &Batch,
        opts: &ForwardOptions,
    ) -> Result<Self::Output> {
        let (t, r) = lengths(batch)?;
        match hidden.size().get(1) {
            Some(&len) if len == r => {}
            other => {
                return Err(EngineError::Batch(format!(
                    "hidden states cover {other:?} positions, the response window {r}"
                )));
            }
        }
        let labels = batch.get("input_ids")?.f_narrow(1, t - r, r)?;
        let targets = topk_targets(batch, opts)?;
        let columns = self.token_columns(hidden, &labels, targets.as_ref(), opts)?;
        self.output_from_columns(&columns, opts)
    }
}

/// The head's window for responses of length `r`: positions `[t - r - 1, t - 1)`.
pub(crate) fn window(batch: &Batch) -> Result<(i64, i64)> {
    let (t, r) = lengths(batch)?;
    Ok((t - r - 1, r))
}

impl FsdpHead for CausalLm {
    fn reads_embedding(&self) -> bool {
        self.config.tie_word_embeddings
    }
}

impl FsdpHead for ValueModel {
    fn reads_embedding(&self) -> bool {
        false
    }
}
