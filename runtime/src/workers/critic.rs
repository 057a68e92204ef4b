//! The critic: values of the rollout's responses and the clipped value update (verl's
//! `DataParallelPPOCritic`): epochs × mini-batches (`critic.ppo_mini_batch_size × n`) ×
//! micro-batches, `L = ½·agg(max((v̂ − R)², (clip(v̂, V ± c) − R)²))` normalised over the
//! mini-batch, one optimizer step per mini-batch and one lr-scheduler step per update.

use tch::Tensor;

use crate::algo::masked::masked_mean;
use crate::algo::{AggOptions, compute_value_loss};
use crate::engine::{Batch, Engine, ForwardOptions, Metrics, MicroLoss};
use crate::model::ValueModel;

use super::{MetricLists, Result, WorkerError, combine_micro, epoch_rows, micro_batching, scalar};

pub use verlc_spec::trainer::CriticSettings;

/// The critic role over any engine with a value head.
#[derive(Debug)]
pub struct Critic<E: Engine<Head = ValueModel>> {
    pub engine: E,
    pub settings: CriticSettings,
}

const ADDITIVE: &[&str] = &["critic/vf_loss"];

impl<E: Engine<Head = ValueModel>> Critic<E> {
    pub fn new(engine: E, settings: CriticSettings) -> Result<Self> {
        let s = &settings;
        if s.ppo_mini_batch_size == 0
            || s.ppo_micro_batch_size == 0
            || s.forward_micro_batch_size == 0
            || s.ppo_epochs == 0
        {
            return Err(WorkerError::Config(
                "critic batch sizes and ppo_epochs must be positive".into(),
            ));
        }
        Ok(Critic { engine, settings })
    }

    /// Values `(N, R)`, zero outside the response mask (verl's `compute_values`).
    pub fn compute_values(&mut self, batch: &Batch) -> Result<Tensor> {
        let s = &self.settings;
        let micro = micro_batching(
            &self.engine,
            batch,
            s.forward_micro_batch_size,
            s.forward_max_token_len,
        )?;
        let outs = self
            .engine
            .infer_batch(batch, &micro, &ForwardOptions::default())?;
        let values = micro.restore(&Tensor::f_cat(&outs, 0)?)?;
        let mask = batch.get("response_mask")?.f_to_kind(values.kind())?;
        Ok(values.f_mul(&mask)?)
    }

    /// One value update on `batch` (needs `values`, `returns`, `response_mask`).
    pub fn update_critic(&mut self, batch: &Batch, step: u64) -> Result<Metrics> {
        let s = self.settings.clone();
        for key in ["values", "returns", "response_mask"] {
            batch.get(key)?;
        }
        let lr = self.engine.lr();
        let mut lists = MetricLists::default();
        for epoch in 0..s.ppo_epochs {
            let data = epoch_rows(batch, s.shuffle, s.data_loader_seed, step, epoch)?;
            for mini in data.split(s.ppo_mini_batch_size)? {
                self.engine.optimizer_zero_grad()?;
                let mut loss_fn = |mb: &Batch,
                                   vpreds: Tensor,
                                   agg: &AggOptions|
                 -> crate::engine::Result<MicroLoss> {
                    let mask = mb.get("response_mask")?;
                    let vl = compute_value_loss(
                        &vpreds,
                        mb.get("returns")?,
                        mb.get("values")?,
                        mask,
                        s.cliprange_value,
                        s.loss_agg_mode,
                        &AggOptions {
                            release: s.release,
                            ..*agg
                        },
                    )?;
                    let mut metrics = Metrics::new();
                    let f = |t: &Tensor| {
                        scalar(t).map_err(|e| crate::engine::EngineError::Batch(e.to_string()))
                    };
                    metrics.insert("critic/vf_loss".into(), f(&vl.loss)?);
                    metrics.insert("critic/vf_clipfrac".into(), f(&vl.vf_clipfrac)?);
                    metrics.insert(
                        "critic/vpred_mean".into(),
                        f(&masked_mean(&vpreds.f_detach()?, mask)?)?,
                    );
                    Ok(MicroLoss {
                        loss: vl.loss,
                        metrics,
                    })
                };
                let cut = micro_batching(
                    &self.engine,
                    &mini,
                    s.ppo_micro_batch_size,
                    s.ppo_max_token_len,
                )?;
                let micro = self.engine.forward_backward(
                    &mini,
                    &cut,
                    &ForwardOptions::default(),
                    &mut loss_fn,
                )?;
                let step_result = self.engine.optimizer_step()?;
                lists.extend(&combine_micro(&micro, ADDITIVE));
                lists.push(
                    "critic/grad_norm",
                    step_result.grad_norm.unwrap_or(f64::NAN),
                );
            }
        }
        self.engine.lr_scheduler_step()?;
        let mut metrics = lists.reduce();
        metrics.insert("critic/lr".into(), lr);
        Ok(metrics)
    }
}
