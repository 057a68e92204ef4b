//! The reference policy: a frozen copy of the actor's initial weights (or of its own
//! `ref.model.path`), forward-only, giving `ref_log_prob` for the KL loss and the in-reward
//! KL penalty. A LoRA actor is its own reference with the adapters switched off
//! ([`ReferencePolicy::ActorWithoutAdapters`], verl's `ref_in_actor`): the base weights never
//! change, so no second copy of the model is kept.

use tch::Tensor;

use crate::engine::{Batch, Engine, ForwardOptions};
use crate::logits::topk::{TopK, TopKOutput, TopKTargets};
use crate::model::CausalLm;

use super::{Result, WorkerError, micro_batching};

/// Where reference log-probs come from.
#[derive(Debug)]
pub enum ReferencePolicy<E: Engine<Head = CausalLm>> {
    /// A forward-only engine of its own.
    Own(Reference<E>),
    /// The actor's engine with its LoRA adapters off.
    ActorWithoutAdapters {
        micro_batch_size: usize,
        /// Dynamic batch size's token budget (`log_prob_use_dynamic_bsz`).
        max_token_len: Option<usize>,
        temperature: f64,
    },
}

impl<E: Engine<Head = CausalLm>> ReferencePolicy<E> {
    /// `ref_log_prob` `(N, R)`; `actor` is the actor's engine.
    pub fn compute_ref_log_prob(&mut self, actor: &mut E, batch: &Batch) -> Result<Tensor> {
        match self {
            ReferencePolicy::Own(r) => r.compute_ref_log_prob(batch),
            ReferencePolicy::ActorWithoutAdapters {
                micro_batch_size,
                max_token_len,
                temperature,
            } => {
                let fwd = ForwardOptions {
                    temperature: *temperature,
                    with_entropy: false,
                    with_sum_pi_squared: false,
                    topk: TopK::Off,
                };
                let micro = micro_batching(actor, batch, *micro_batch_size, *max_token_len)?;
                actor.set_adapters_enabled(false)?;
                let outs = actor.infer_batch(batch, &micro, &fwd);
                actor.set_adapters_enabled(true)?;
                let lps: Vec<Tensor> = outs?.into_iter().map(|o| o.log_probs).collect();
                Ok(micro.restore(&Tensor::f_cat(&lps, 0)?)?)
            }
        }
    }
}

/// The reference role over a forward-only engine with a causal-LM head.
#[derive(Debug)]
pub struct Reference<E: Engine<Head = CausalLm>> {
    pub engine: E,
    /// `ref.log_prob_micro_batch_size_per_gpu`.
    pub micro_batch_size: usize,
    /// Dynamic batch size's token budget (`ref.log_prob_use_dynamic_bsz`).
    pub max_token_len: Option<usize>,
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
            max_token_len: None,
            temperature,
        })
    }

    /// `ref_log_prob` `(N, R)` (verl's `compute_ref_log_prob`).
    pub fn compute_ref_log_prob(&mut self, batch: &Batch) -> Result<Tensor> {
        let fwd = self.options(TopK::Off);
        let micro = self.micro_batching(batch)?;
        let outs = self.engine.infer_batch(batch, &micro, &fwd)?;
        let lps: Vec<Tensor> = outs.into_iter().map(|o| o.log_probs).collect();
        Ok(micro.restore(&Tensor::f_cat(&lps, 0)?)?)
    }

    /// The model's own `k` most likely tokens at every response position: ids and log-probs
    /// `(N, R, k)` (a teacher's side of the top-k distillation loss).
    pub fn compute_topk(&mut self, batch: &Batch, k: i64) -> Result<TopKTargets> {
        let fwd = self.options(TopK::Own(k));
        let micro = self.micro_batching(batch)?;
        let (mut ids, mut lps) = (Vec::new(), Vec::new());
        for out in self.engine.infer_batch(batch, &micro, &fwd)? {
            match out.topk {
                Some(TopKOutput::Own(t)) => {
                    ids.push(t.ids);
                    lps.push(t.log_probs);
                }
                _ => {
                    return Err(WorkerError::Config(
                        "the teacher's forward returned no top-k".into(),
                    ));
                }
            }
        }
        Ok(TopKTargets {
            ids: micro.restore(&Tensor::f_cat(&ids, 0)?)?,
            log_probs: micro.restore(&Tensor::f_cat(&lps, 0)?)?,
        })
    }

    fn options(&self, topk: TopK) -> ForwardOptions {
        ForwardOptions {
            temperature: self.temperature,
            with_entropy: false,
            with_sum_pi_squared: false,
            topk,
        }
    }

    fn micro_batching(&self, batch: &Batch) -> Result<crate::engine::MicroBatching> {
        micro_batching(
            &self.engine,
            batch,
            self.micro_batch_size,
            self.max_token_len,
        )
    }
}
