//! [`FsdpHead`]: what the FSDP engine needs from a [`Head`] to run it unit by unit: the
//! backbone (embeddings, layers, final norm, rotary embedding) and the head's output computed
//! from the final hidden states, exactly as the head's own forward computes it.

use tch::{Kind, Tensor};

use crate::engine::{Batch, EngineError, ForwardOptions, Head, Result};
use crate::model::decoder::Model;
use crate::model::{CausalLm, ValueModel};
use crate::rollout::LogProbOutput;
use crate::rollout::logprob::{entropy_from_logits, log_probs_from_logits};

/// A head the FSDP engine can run segment by segment.
pub trait FsdpHead: Head {
    fn backbone(&self) -> &Model;
    /// Whether the head reads the embedding matrix (tied embeddings).
    fn reads_embedding(&self) -> bool;
    /// The head's output from the normed final hidden states `(N, T, hidden)` of `batch`.
    fn output_from_hidden(
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

impl FsdpHead for CausalLm {
    fn backbone(&self) -> &Model {
        &self.model
    }

    fn reads_embedding(&self) -> bool {
        self.config.tie_word_embeddings
    }

    fn output_from_hidden(
        &self,
        hidden: &Tensor,
        batch: &Batch,
        opts: &ForwardOptions,
    ) -> Result<LogProbOutput> {
        let (t, r) = lengths(batch)?;
        if opts.temperature.is_nan() || opts.temperature <= 0.0 {
            return Err(EngineError::Config(format!(
                "temperature must be positive, got {}",
                opts.temperature
            )));
        }
        let hidden = hidden.f_narrow(1, t - r - 1, r)?;
        let mut logits = self.logits(&hidden);
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
    fn backbone(&self) -> &Model {
        &self.model
    }

    fn reads_embedding(&self) -> bool {
        false
    }

    fn output_from_hidden(
        &self,
        hidden: &Tensor,
        batch: &Batch,
        _opts: &ForwardOptions,
    ) -> Result<Tensor> {
        let (t, r) = lengths(batch)?;
        let hidden = hidden.f_narrow(1, t - r - 1, r)?;
        Ok(self
            .score()
            .forward(&hidden)
            .f_squeeze_dim(-1)?
            .f_to_kind(Kind::Float)?)
    }
}
