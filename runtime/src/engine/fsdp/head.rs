//! [`FsdpHead`]: what the FSDP engine needs from a [`Head`] to run it unit by unit: the
//! backbone (embeddings, layers, final norm, rotary embedding) and the head's output computed
//! from the final hidden states, exactly as the head's own forward computes it.

use tch::{Kind, Tensor};

use crate::engine::{Batch, EngineError, ForwardOptions, Head, Result};
use crate::model::{CausalLm, ValueModel};
use crate::rollout::LogProbOutput;
use crate::rollout::logprob::{entropy_from_logits, log_probs_from_logits};

/// A head the FSDP engine can run segment by segment.
pub trait FsdpHead: Head {
    /// Whether the head reads the embedding matrix (tied embeddings).
    fn reads_embedding(&self) -> bool;
    /// The head's output from the normed final hidden states `(N, R, hidden)` of the positions
    /// that predict the `R` response tokens of `batch` (`[T - R - 1, T - 1)`), the window the
    /// engine's last layer computes ([`crate::model::decoder::Model::forward_window`]).
    fn output_from_window(
        &self,
        hidden: &Tensor,
        batch: &Batch,
        opts: &ForwardOptions,
    ) -> Result<Self::Output>;
}

/// `(T, R)`: sequence and response lengths of `batch`, checked.
pub(crate) fn lengths(batch: &Batch) -> Result<(i64, i64)> {
    let r = batch.get("responses")?.size().get(1).copied().unwrap_or(0);
    let t = batch.get("input_ids")?.size().get(1).copied().unwrap_or(0);
    if r < 1 || r >= t {
        return Err(EngineError::Batch(format!(
            "responses of length {r} do not fit sequences of length {t}"
        )));
    }
    Ok((t, r))
}

/// The head's window for responses of length `r`: positions `[t - r - 1, t - 1)`.
pub(crate) fn window(batch: &Batch) -> Result<(i64, i64)> {
    let (t, r) = lengths(batch)?;
    Ok((t - r - 1, r))
}

fn window_fits(hidden: &Tensor, r: i64) -> Result<()> {
    match hidden.size().get(1) {
        Some(&len) if len == r => Ok(()),
        other => Err(EngineError::Batch(format!(
            "hidden states cover {other:?} positions, the response window {r}"
        ))),
    }
}

impl FsdpHead for CausalLm {
    fn reads_embedding(&self) -> bool {
        self.config.tie_word_embeddings
    }

    fn output_from_window(
        &self,
        hidden: &Tensor,
        batch: &Batch,
        opts: &ForwardOptions,
    ) -> Result<LogProbOutput> {
        let (t, r) = lengths(batch)?;
        window_fits(hidden, r)?;
        crate::engine::check_temperature(opts.temperature)?;
        let mut logits = self.logits(hidden);
        if opts.temperature != 1.0 {
            logits /= opts.temperature;
        }
        let labels = batch.get("input_ids")?.f_narrow(1, t - r, r)?;
        Ok(LogProbOutput {
            log_probs: log_probs_from_logits(&logits, &labels),
            entropy: opts.with_entropy.then(|| entropy_from_logits(&logits)),
        })
    }
}

impl FsdpHead for ValueModel {
    fn reads_embedding(&self) -> bool {
        false
    }

    fn output_from_window(
        &self,
        hidden: &Tensor,
        batch: &Batch,
        _opts: &ForwardOptions,
    ) -> Result<Tensor> {
        let (_, r) = lengths(batch)?;
        window_fits(hidden, r)?;
        Ok(self
            .score()
            .forward(hidden)
            .f_squeeze_dim(-1)?
            .f_to_kind(Kind::Float)?)
    }
}
