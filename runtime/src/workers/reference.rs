//! The reference policy: a frozen copy of the actor's initial weights (or of its own
//! `ref.model.path`), forward-only, giving `ref_log_prob` for the KL loss and the in-reward
//! KL penalty.

use tch::Tensor;

use crate::engine::{Batch, Engine, ForwardOptions};
use crate::model::CausalLm;

use super::{Result, WorkerError};

/// The reference role over a forward-only engine with a causal-LM head.
#[derive(Debug)]
pub struct Reference<E: Engine<Head = CausalLm>> {
    pub engine: E,
    /// `ref.log_prob_micro_batch_size_per_gpu`.
    pub micro_batch_size: usize,
    /// The rollout temperature (verl divides the reference logits by it too).
    pub temperature: f64,
}

impl<E: Engine<Head = CausalLm>> Reference<E> {
    pub fn new(engine: E, micro_batch_size: usize, temperature: f64) -> Result<Self> {
        if micro_batch_size == 0 {
            return Err(WorkerError::Config(
                "ref.log_prob_micro_batch_size_per_gpu must be positive".into(),
            ));
        }
        Ok(Reference {
            engine,
            micro_batch_size,
            temperature,
        })
    }

    /// `ref_log_prob` `(N, R)` (verl's `compute_ref_log_prob`).
    pub fn compute_ref_log_prob(&mut self, batch: &Batch) -> Result<Tensor> {
        let fwd = ForwardOptions {
            temperature: self.temperature,
            with_entropy: false,
        };
        let outs = self
            .engine
            .infer_batch(batch, self.micro_batch_size, &fwd)?;
        let lps: Vec<Tensor> = outs.into_iter().map(|o| o.log_probs).collect();
        Ok(Tensor::f_cat(&lps, 0)?)
    }
}
