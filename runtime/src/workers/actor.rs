//! The actor: old log-probs and entropy of the rollout's responses, and the PPO update
//! (verl's `DataParallelPPOActor.update_policy` / the engine worker's `train_mini_batch`).
//!
//! One update: for each of `ppo_epochs` epochs, the batch is (optionally) shuffled with a seed
//! derived from `data_loader_seed`, the step and the epoch, then cut into mini-batches of
//! `ppo_mini_batch_size × rollout.n` responses; each mini-batch is one optimizer step,
//! accumulated over micro-batches of `ppo_micro_batch_size_per_gpu`. The loss of a micro-batch
//! is
//!
//! `L = pg_loss − entropy_coeff · agg(H) + kl_loss_coef · agg(kl(log π, log π_ref))`
//!
//! with every `agg` normalised over the whole mini-batch (see [`crate::engine`]), so the
//! gradient does not depend on the micro-batch size. The lr scheduler steps once per update.

use tch::{Kind, Tensor};

use crate::algo::distillation::{DistillationInputs, DistillationMode, Teacher, distillation_term};
use crate::algo::kl::kl_penalty;
use crate::algo::rollout_correction::bypass_policy_loss;
use crate::algo::{AggOptions, PolicyLossInputs, agg_loss, compute_policy_loss};
use crate::engine::{Batch, Engine, ForwardOptions, Metrics, MicroLoss};
use crate::logits::LogProbOutput;
use crate::logits::topk::{TopK, TopKOutput};
use crate::model::CausalLm;

use super::{MetricLists, Result, WorkerError, combine_micro, epoch_rows, micro_batching, scalar};

pub use verlc_spec::trainer::ActorSettings;

/// The actor role over any engine with a causal-LM head.
#[derive(Debug)]
pub struct Actor<E: Engine<Head = CausalLm>> {
    pub engine: E,
    pub settings: ActorSettings,
}

/// Additive (globally normalised) metrics of a micro-batch.
const ADDITIVE: &[&str] = &[
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy_loss",
    "actor/loss",
    "actor/distillation/loss",
];

impl<E: Engine<Head = CausalLm>> Actor<E> {
    pub fn new(engine: E, settings: ActorSettings) -> Result<Self> {
        let s = &settings;
        if s.ppo_mini_batch_size == 0
            || s.ppo_micro_batch_size == 0
            || s.log_prob_micro_batch_size == 0
            || s.ppo_epochs == 0
        {
            return Err(WorkerError::Config(
                "actor batch sizes and ppo_epochs must be positive".into(),
            ));
        }
        Ok(Actor { engine, settings })
    }

    /// Log-probs `(N, R)` of the responses under the current policy, their entropy and, with
    /// `calculate_sum_pi_squared`, `Σ_v π_v²` (verl's `compute_log_prob`: `old_log_probs`, the
    /// `actor/entropy` metric and `sum_pi_squared`).
    pub fn compute_log_prob(&mut self, batch: &Batch) -> Result<LogProbOutput> {
        let fwd = ForwardOptions {
            temperature: self.settings.temperature,
            with_entropy: true,
            with_sum_pi_squared: self.settings.calculate_sum_pi_squared,
            topk: TopK::Off,
        };
        let s = &self.settings;
        let micro = micro_batching(
            &self.engine,
            batch,
            s.log_prob_micro_batch_size,
            s.log_prob_max_token_len,
        )?;
        let outs = self.engine.infer_batch(batch, &micro, &fwd)?;
        let (mut lps, mut ents, mut sq) = (Vec::new(), Vec::new(), Vec::new());
        for out in outs {
            lps.push(out.log_probs);
            ents.extend(out.entropy);
            sq.extend(out.sum_pi_squared);
        }
        let sum_pi_squared = if fwd.with_sum_pi_squared {
            Some(micro.restore(&Tensor::f_cat(&sq, 0)?)?)
        } else {
            None
        };
        Ok(LogProbOutput {
            log_probs: micro.restore(&Tensor::f_cat(&lps, 0)?)?,
            entropy: Some(micro.restore(&Tensor::f_cat(&ents, 0)?)?),
            sum_pi_squared,
            topk: None,
        })
    }

    /// `agg(entropy)` over the response mask with the actor's `loss_agg_mode` (the
    /// `actor/entropy` metric of the old-log-prob pass).
    pub fn entropy_metric(&self, entropy: &Tensor, response_mask: &Tensor) -> Result<f64> {
        let agg = agg_loss(
            entropy,
            response_mask,
            self.settings.loss_agg_mode,
            &AggOptions {
                release: self.settings.policy_loss.release,
                ..AggOptions::default()
            },
        )?;
        scalar(&agg)
    }

    /// One PPO update on `batch` (needs `old_log_probs`, `advantages` and, with the KL loss,
    /// `ref_log_prob`); `step` seeds the shuffling. Returns the `actor/*` metrics.
    pub fn update_policy(&mut self, batch: &Batch, step: u64) -> Result<Metrics> {
        let s = self.settings.clone();
        for key in ["old_log_probs", "advantages", "response_mask"] {
            batch.get(key)?;
        }
        if s.use_kl_loss {
            batch.get("ref_log_prob")?;
        }
        let lr = self.engine.lr();
        let with_entropy = s.entropy_coeff != 0.0 || s.calculate_entropy;
        let fwd = ForwardOptions {
            temperature: s.temperature,
            with_entropy,
            with_sum_pi_squared: false,
            topk: student_topk(&s),
        };
        let mut lists = MetricLists::default();
        // The order of the optimizer steps: (epoch, mini-batch) pairs, epoch-major as verl's
        // update, or mini-batch-major as its separate_async (each mini-batch its own update).
        let minis: Vec<Batch>;
        let parts: Vec<&Batch> = if s.epochs_per_mini_batch {
            minis = batch.split(s.ppo_mini_batch_size)?;
            minis.iter().collect()
        } else {
            vec![batch]
        };
        for whole in parts {
            for epoch in 0..s.ppo_epochs {
                let data = epoch_rows(whole, s.shuffle, s.data_loader_seed, step, epoch)?;
                for mini in data.split(s.ppo_mini_batch_size)? {
                    self.update_mini_batch(&s, &mini, &fwd, &mut lists)?;
                }
            }
        }
        self.engine.lr_scheduler_step()?;
        let mut metrics = lists.reduce();
        metrics.insert("actor/lr".into(), lr);
        Ok(metrics)
    }
}

impl<E: Engine<Head = CausalLm>> Actor<E> {
    /// One optimizer step on `mini`, accumulated over its micro-batches; its metrics into
    /// `lists`.
    fn update_mini_batch(
        &mut self,
        s: &ActorSettings,
        mini: &Batch,
        fwd: &ForwardOptions,
        lists: &mut MetricLists,
    ) -> Result<()> {
        self.engine.optimizer_zero_grad()?;
        let mut loss_fn =
            |mb: &Batch, out: LogProbOutput, agg: &AggOptions| micro_loss(s, mb, out, agg);
        let cut = micro_batching(
            &self.engine,
            mini,
            s.ppo_micro_batch_size,
            s.ppo_max_token_len,
        )?;
        let micro = self
            .engine
            .forward_backward(mini, &cut, fwd, &mut loss_fn)?;
        let step_result = self.engine.optimizer_step()?;
        lists.extend(&combine_micro(&micro, ADDITIVE));
        lists.push("actor/grad_norm", step_result.grad_norm.unwrap_or(f64::NAN));
        Ok(())
    }
}

/// The loss of one micro-batch and its metrics: the task's PPO loss, and with on-policy
/// distillation its term (verl 0.9's `distillation_ppo_loss`: added times its coefficient;
/// the task's loss is left out when `use_task_rewards` is off, and not computed at all when
/// the distillation term is supervised too).
fn micro_loss(
    s: &ActorSettings,
    mb: &Batch,
    out: LogProbOutput,
    agg: &AggOptions,
) -> crate::engine::Result<MicroLoss> {
    // Every term aggregates as the release the config was judged against does.
    let agg = &AggOptions {
        release: s.policy_loss.release,
        ..*agg
    };
    let Some(dist) = &s.distillation else {
        return task_loss(s, mb, &out, agg);
    };
    let teacher = match &out.topk {
        Some(TopKOutput::Kl(kl)) => Teacher::TopK(kl),
        _ => Teacher::LogProb(mb.get("teacher_log_prob")?),
    };
    let inputs = DistillationInputs {
        log_prob: &out.log_probs,
        teacher,
        old_log_prob: mb.get("old_log_probs")?,
        response_mask: mb.get("response_mask")?,
        rollout_is_weights: mb.opt("rollout_is_weights"),
    };
    let term = distillation_term(dist, &inputs, s.loss_agg_mode, agg)?;
    let mut micro = if dist.use_task_rewards || dist.use_policy_gradient {
        task_loss(s, mb, &out, agg)?
    } else {
        MicroLoss {
            loss: term.loss.f_zeros_like()?,
            metrics: Metrics::new(),
        }
    };
    if !dist.use_task_rewards {
        micro.loss = micro.loss.f_zeros_like()?;
    }
    micro
        .metrics
        .insert("actor/distillation/loss".into(), metric(&term.loss)?);
    micro.metrics.extend(term.metrics);
    micro.loss = micro.loss.f_add(&term.loss.f_mul_scalar(dist.coef)?)?;
    Ok(micro)
}

/// What the actor's training forward computes for the top-k distillation loss: its KL against
/// the teacher's top-k (the batch's `teacher_topk_*`), at the rollout temperature like the
/// log-probs (verl's logits processor sees the temperature-scaled logits).
fn student_topk(s: &ActorSettings) -> TopK {
    match s.distillation.map(|d| d.mode) {
        Some(DistillationMode::ForwardKlTopk {
            topk,
            log_prob_min_clamp,
        }) => TopK::KlToTeacher {
            k: topk,
            log_prob_min_clamp,
        },
        _ => TopK::Off,
    }
}

/// A loss's value for the metrics.
fn metric(t: &Tensor) -> crate::engine::Result<f64> {
    Ok(t.f_detach()?.f_to_kind(Kind::Double)?.f_double_value(&[])?)
}

/// The task's loss of one micro-batch (policy loss, entropy bonus, KL loss) and its metrics.
fn task_loss(
    s: &ActorSettings,
    mb: &Batch,
    out: &LogProbOutput,
    agg: &AggOptions,
) -> crate::engine::Result<MicroLoss> {
    let mask = mb.get("response_mask")?;
    let old = mb.get("old_log_probs")?;
    let adv = mb.get("advantages")?;
    let log_prob = &out.log_probs;
    let mut metrics = Metrics::new();
    let pg = match &s.bypass {
        Some(b) => {
            let inputs = PolicyLossInputs::new(old, log_prob, adv, mask);
            let (pg, corr) = bypass_policy_loss(b, &inputs, &s.policy_loss, s.loss_agg_mode, agg)?;
            metrics.extend(corr);
            pg
        }
        None => {
            let mut inputs = PolicyLossInputs::new(old, log_prob, adv, mask);
            if let Some(w) = mb.opt("rollout_is_weights") {
                inputs = inputs.rollout_is_weights(w);
            }
            let pg =
                compute_policy_loss(s.loss_mode, &inputs, &s.policy_loss, s.loss_agg_mode, agg)?;
            for (k, v) in pg.metrics.named()? {
                metrics.insert(k.to_owned(), v);
            }
            pg.loss
        }
    };
    metrics.insert("actor/pg_loss".into(), metric(&pg)?);
    let mut loss = pg;
    if let Some(entropy) = &out.entropy {
        let ent = agg_loss(entropy, mask, s.loss_agg_mode, agg)?;
        metrics.insert("actor/entropy_loss".into(), metric(&ent)?);
        if s.entropy_coeff != 0.0 {
            loss = loss.f_sub(&ent.f_mul_scalar(s.entropy_coeff)?)?;
        }
    }
    if s.use_kl_loss {
        let ref_lp = mb.get("ref_log_prob")?;
        let kld = kl_penalty(log_prob, ref_lp, s.kl_loss_type)?;
        let kl = agg_loss(&kld, mask, s.loss_agg_mode, agg)?;
        metrics.insert("actor/kl_loss".into(), metric(&kl)?);
        metrics.insert("actor/kl_coef".into(), s.kl_loss_coef);
        loss = loss.f_add(&kl.f_mul_scalar(s.kl_loss_coef)?)?;
    }
    metrics.insert("actor/loss".into(), metric(&loss)?);
    Ok(MicroLoss { loss, metrics })
}
