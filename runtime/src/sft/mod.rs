//! Supervised fine-tuning: verl's SFT trainer (`verl.trainer.sft_trainer.SFTTrainer.fit`) over
//! the same engines, worker roles and checkpoint layout as the RL loop.
//!
//! One step, in verl's order: the step's conversations (`data.train_batch_size` of them over
//! every data-parallel rank; a seeded permutation per epoch, the last incomplete batch
//! dropped) → forward and backward in micro-batches (`micro_batch_size_per_gpu` rows, or
//! verl's dynamic batch size under the rank's token budget) → one optimizer step and one lr
//! scheduler step → validation (`test_freq`, and after the last step when there is validation
//! data) → checkpoint (`save_freq`, and after the last step) → metrics with verl's names
//! (`train/loss`, `train/grad_norm`, `train/lr`, `train/global_tokens`,
//! `train/total_tokens(B)`, `val/loss`; and `timing_s/step`, the step's wall time).
//!
//! The loss is verl's `sft_loss`: minus the log-probabilities of the assistant replies' tokens,
//! summed and divided by the step's loss tokens over every rank (so the update is the token
//! mean of the whole step, however the rows are cut into micro-batches and ranks).
//! `train/loss` is that token mean; `val/loss` the mean over validation batches of each
//! batch's token mean.
//!
//! Rows go to data-parallel ranks in contiguous chunks of the step's batch (verl's
//! `DistributedSampler` strides them; the step's update is the same).
//!
//! Checkpoints: `{default_local_dir}/global_step_{N}/` holds `huggingface/` (config, weights
//! and tokenizer, loadable by transformers and by `actor_rollout_ref.model.path` of an RL
//! run), with LoRA `lora_adapter/`, the optimizer and scheduler state, and `data.json` (step
//! and sampler position); `latest_checkpointed_iteration.txt` names the last complete one.

mod collate;
mod legacy;

use std::path::PathBuf;

use tch::{Kind, Tensor};
use verlc_spec::sft::{SftSpec, SftTrainerKind};

use crate::algo::AggOptions;
use crate::data::BatchSampler;
use crate::data::sft::{SftDataset, SftExample, SftOptions};
use crate::engine::{
    Batch, Engine, EngineSettings, ForwardOptions, Metrics, MicroBatching, MicroLoss,
    micro::dynamic_parts,
};
use crate::logging::{Tracking, TrackingOptions};
use crate::logits::LogProbOutput;
use crate::model::CausalLm;
use crate::tokenizer::Tokenizer;
use crate::trainer::checkpoint::{self, TrainerState};
use crate::trainer::parallel::{DataParallel, Roles, SingleRoles};
use crate::trainer::{RunOptions, RunSummary, TrainerError};

pub use collate::collate;

fn bad(msg: impl Into<String>) -> TrainerError {
    TrainerError::Config(msg.into())
}

/// The log-probabilities of `batch`'s rows without gradients, in row order.
fn infer_log_probs<E: Engine<Head = CausalLm>>(
    engine: &mut E,
    batch: &Batch,
    micro: &MicroBatching,
) -> Result<Tensor, TrainerError> {
    let outs = engine.infer_batch(batch, micro, &ForwardOptions::default())?;
    let log_probs = Tensor::f_cat(
        &outs
            .iter()
            .map(|o| o.log_probs.shallow_clone())
            .collect::<Vec<_>>(),
        0,
    )?;
    Ok(micro.restore(&log_probs)?)
}

/// Trains `spec` in this process (one rank, the single engine).
pub fn run(spec: &SftSpec, opts: &RunOptions) -> Result<RunSummary, TrainerError> {
    run_with(spec, opts, SingleRoles)
}

/// Trains `spec` as one rank of `roles`' world (every rank calls it).
pub fn run_with<R: Roles>(
    spec: &SftSpec,
    opts: &RunOptions,
    roles: R,
) -> Result<RunSummary, TrainerError> {
    SftTrainer::new(spec, opts, roles)?.fit()
}

/// The dataset options of `spec`'s data for `max_samples` rows.
pub fn dataset_options(spec: &SftSpec, max_samples: Option<usize>) -> SftOptions {
    let d = &spec.data;
    SftOptions {
        messages_key: d.messages_key.clone(),
        tools_key: d.tools_key.clone(),
        enable_thinking_key: d.enable_thinking_key.clone(),
        enable_thinking_default: d.enable_thinking_default,
        max_length: d.max_length,
        truncation: d.truncation,
        ignore_input_ids_mismatch: d.ignore_input_ids_mismatch,
        chat_template_kwargs: d.chat_template_kwargs.clone(),
        max_samples,
        shuffle: false,
        seed: 0,
        release: spec.release,
        format: d.format.clone(),
        padding: d.padding,
    }
}

/// One rank's SFT run.
pub struct SftTrainer<R: Roles> {
    spec: SftSpec,
    tokenizer: Tokenizer,
    train: SftDataset,
    val: Option<SftDataset>,
    sampler: BatchSampler,
    engine: R::Actor,
    dp: DataParallel,
    tracking: Tracking,
    ckpt_root: PathBuf,
    ckpt_tag: u64,
    global_step: u64,
    resumed_from: u64,
    total_steps: u64,
    steps_per_epoch: u64,
    total_tokens: f64,
}

impl<R: Roles> SftTrainer<R> {
    /// Loads the data and the model and restores the checkpoint the resume mode asks for.
    /// Collective over `roles`' world.
    pub fn new(spec: &SftSpec, opts: &RunOptions, roles: R) -> Result<Self, TrainerError> {
        let world = spec.world.size();
        let ranks = roles.world().map_or(1, |w| w.size());
        if world != ranks {
            return Err(bad(format!(
                "trainer.nnodes × trainer.n_gpus_per_node = {world}, but the trainer runs on {ranks} rank(s)"
            )));
        }
        let tokenizer = Tokenizer::from_pretrained(&spec.model.tokenizer_path)?;
        let train = SftDataset::load(
            &spec.data.train_files,
            &tokenizer,
            &dataset_options(spec, spec.data.train_max_samples),
        )?;
        let val = if spec.data.val_files.is_empty() {
            None
        } else {
            Some(SftDataset::load(
                &spec.data.val_files,
                &tokenizer,
                &dataset_options(spec, spec.data.val_max_samples),
            )?)
        };
        let global_batch = spec.batching.global_batch;
        if train.len() < global_batch {
            return Err(bad(format!(
                "data.train_files hold {} conversation(s), fewer than one step's data.train_batch_size={global_batch}",
                train.len()
            )));
        }
        let val_batch = spec.val_batch();
        if let Some(v) = val.as_ref().filter(|v| v.len() < val_batch) {
            let what = if spec.trainer.is_legacy() {
                format!(
                    "data.micro_batch_size_per_gpu={} on each of {} data-parallel rank(s); verl's legacy trainer fails stacking no validation loss",
                    spec.batching.micro_batch,
                    spec.data_parallel()
                )
            } else {
                format!("data.train_batch_size={global_batch} (verl would log val/loss as nan)")
            };
            return Err(bad(format!(
                "data.val_files hold {} conversation(s), fewer than one validation batch of {what}",
                v.len()
            )));
        }
        let sampler = BatchSampler::new(train.len(), global_batch, true, spec.run.seed, true)?;
        let steps_per_epoch = spec.steps_per_epoch(train.len());
        let total_steps = spec.total_steps(train.len());
        let m = &spec.model;
        let engine = roles.actor(
            &m.engine,
            EngineSettings {
                model_path: m.path.clone(),
                device: opts.device,
                param_dtype: spec.binding.precision,
                main_dtype: m.engine.main_dtype(),
                seed: m.seed,
                optim: Some(m.optim.resolve(spec.schedule_steps(train.len()))),
                loss_scale_factor: None,
                loss_scaling: opts.loss_scaling,
                lora: m
                    .lora
                    .as_ref()
                    .map(crate::trainer::lora_config)
                    .transpose()?,
                config_overrides: m.config_overrides.clone(),
                remove_padding: m.engine.remove_padding(),
            },
        )?;
        let dp = DataParallel {
            group: roles.data_group(&engine),
            world: roles.world().cloned(),
        };
        if !global_batch.is_multiple_of(dp.size()) {
            return Err(bad(format!(
                "data.train_batch_size={global_batch} cannot be split over {} data-parallel ranks",
                dp.size()
            )));
        }
        let ckpt_root = crate::trainer::absolute(&spec.run.checkpoint_dir);
        let ckpt_tag = dp.broadcast_from_main(i64::from(std::process::id()))? as u64;
        let mut trainer = SftTrainer {
            spec: spec.clone(),
            tokenizer,
            train,
            val,
            sampler,
            engine,
            dp,
            tracking: Tracking::from_loggers(Vec::new()),
            ckpt_root,
            ckpt_tag,
            global_step: 0,
            resumed_from: 0,
            total_steps,
            steps_per_epoch,
            total_tokens: 0.0,
        };
        trainer.load_checkpoint()?;
        if trainer.dp.is_main() {
            let val = trainer.val.as_ref().map(|v| v.warnings("data.val_files"));
            for w in trainer
                .train
                .warnings("data.train_files")
                .into_iter()
                .chain(val.into_iter().flatten())
            {
                eprintln!("warning: {w}");
            }
            trainer.tracking = Tracking::new(
                &spec.run.loggers,
                &TrackingOptions {
                    project: spec.run.project_name.clone(),
                    experiment: spec.run.experiment_name.clone(),
                    total_steps,
                    resume_from_step: (trainer.global_step > 0).then_some(trainer.global_step),
                    console_lines: opts.console_lines,
                    config: serde_json::to_value(spec).unwrap_or_default(),
                    python: crate::workers::reward::python::PythonSettings::default_python(),
                    tracker_env: Vec::new(),
                },
            )?;
        }
        Ok(trainer)
    }

    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// The engine (tests read its parameters).
    pub fn engine(&self) -> &R::Actor {
        &self.engine
    }

    /// Trains to the last step; returns every step's metrics.
    pub fn fit(mut self) -> Result<RunSummary, TrainerError> {
        let mut history = Vec::new();
        let test_every = self.spec.run.test_freq.every(self.steps_per_epoch);
        let save_every = self.spec.run.save_freq.every(self.steps_per_epoch);
        // The legacy trainer's loop ends with its epochs; a `total_training_steps` beyond them
        // never reaches its last-step validation and save.
        let last_step = match self.spec.trainer {
            SftTrainerKind::Legacy { .. } => self
                .spec
                .run
                .total_training_steps
                .unwrap_or(self.total_steps),
            SftTrainerKind::Engine => self.total_steps,
        };
        while self.global_step < self.total_steps {
            self.global_step += 1;
            let step = self.global_step;
            let started = std::time::Instant::now();
            let mut metrics = match self.spec.trainer {
                SftTrainerKind::Engine => self.train_step()?,
                SftTrainerKind::Legacy { balance_dp_token } => {
                    self.legacy_train_step(balance_dp_token)?
                }
            };
            let last = step >= last_step;
            let validate = (last && self.val.is_some())
                || (self.val.is_some() && test_every.is_some_and(|n| step.is_multiple_of(n)));
            if validate {
                let loss = match self.spec.trainer {
                    SftTrainerKind::Engine => self.validate()?,
                    SftTrainerKind::Legacy { balance_dp_token } => {
                        self.legacy_validate(balance_dp_token)?
                    }
                };
                metrics.insert("val/loss".into(), loss);
            }
            let save = last || save_every.is_some_and(|n| step.is_multiple_of(n));
            if save {
                self.save_checkpoint()?;
            }
            // verlc's addition (verl's SFT trainer logs no step time), named as the RL
            // trainer's.
            metrics.insert("timing_s/step".into(), started.elapsed().as_secs_f64());
            if self.dp.is_main() {
                self.tracking.log(step, &metrics)?;
            }
            if save {
                self.commit_checkpoint()?;
            }
            history.push((step, metrics));
        }
        self.tracking.finish();
        Ok(RunSummary {
            history,
            resumed_from: self.resumed_from,
            last_step: self.global_step,
        })
    }

    /// This rank's rows of the next step's batch.
    fn next_rows(&mut self) -> Result<Vec<usize>, TrainerError> {
        let batch = self.sampler.next_batch();
        let mine = self.dp.chunk(batch.len())?;
        Ok(batch[mine].to_vec())
    }

    /// How the engine cuts `rows`: fixed micro-batches, or balanced parts under the token
    /// budget with as many on every rank.
    fn micro_batching(&self, rows: &[&SftExample]) -> Result<MicroBatching, TrainerError> {
        match self.spec.batching.token_budget {
            None => Ok(MicroBatching::Rows(self.spec.batching.micro_batch)),
            Some(budget) => Ok(MicroBatching::Parts(dynamic_parts(
                &collate::row_lengths(rows),
                budget,
                |n| self.engine.max_over_ranks(n),
            )?)),
        }
    }

    /// One optimizer step; the `train/*` metrics.
    fn train_step(&mut self) -> Result<Metrics, TrainerError> {
        let index = self.next_rows()?;
        let rows: Vec<&SftExample> = index.iter().map(|&i| &self.train.examples[i]).collect();
        let batch = collate(&rows, self.tokenizer.pad_token_id)?;
        let micro = self.micro_batching(&rows)?;
        let tokens: i64 = rows.iter().map(|r| r.input_ids.len() as i64).sum();
        let lr = self.engine.lr();
        self.engine.optimizer_zero_grad()?;
        let local = self.backward_micro_batches(&batch, &micro, |_, log_probs, mask, agg| {
            crate::algo::sft_loss::sft_loss_rows(log_probs, mask, agg)
        })?;
        let step = self.engine.optimizer_step()?;
        self.engine.lr_scheduler_step()?;
        // Each micro-batch's loss is its share of the step's token mean times the
        // data-parallel size: their sum averaged over the ranks is the token mean.
        let mut metrics = self
            .dp
            .mean_metrics(Metrics::from([("train/loss".to_owned(), local)]))?;
        let global_tokens = self.dp.sum(tokens)? as f64;
        self.total_tokens += global_tokens;
        metrics.insert("train/grad_norm".into(), step.grad_norm.unwrap_or(f64::NAN));
        metrics.insert("train/lr".into(), lr);
        metrics.insert("train/global_tokens".into(), global_tokens);
        metrics.insert("train/total_tokens(B)".into(), self.total_tokens / 1e9);
        Ok(metrics)
    }

    /// Forward and backward of `batch` in `micro` micro-batches, each micro-batch's loss
    /// `loss(index, log_probs, response_mask, agg)`; the sum of this rank's micro-batch losses.
    fn backward_micro_batches(
        &mut self,
        batch: &Batch,
        micro: &MicroBatching,
        mut loss: impl FnMut(usize, &Tensor, &Tensor, &AggOptions) -> Result<Tensor, tch::TchError>,
    ) -> Result<f64, TrainerError> {
        let mut index = 0usize;
        let mut loss_fn = |mb: &Batch, out: LogProbOutput, agg: &AggOptions| {
            let value = loss(index, &out.log_probs, mb.get("response_mask")?, agg)?;
            index += 1;
            let scalar = value.f_detach()?.f_double_value(&[])?;
            Ok(MicroLoss {
                loss: value,
                metrics: Metrics::from([("loss".to_owned(), scalar)]),
            })
        };
        let per_micro =
            self.engine
                .forward_backward(batch, micro, &ForwardOptions::default(), &mut loss_fn)?;
        Ok(per_micro.iter().filter_map(|m| m.get("loss")).sum())
    }

    /// verl's validation: each batch's token-mean loss over every rank, averaged over the
    /// batches (the incomplete last batch dropped).
    fn validate(&mut self) -> Result<f64, TrainerError> {
        let Some(val) = self.val.as_ref() else {
            return Ok(f64::NAN);
        };
        let global_batch = self.spec.batching.global_batch;
        let batches = val.len() / global_batch;
        let mut losses = Vec::with_capacity(batches);
        for b in 0..batches {
            let mine = self.dp.chunk(global_batch)?;
            let rows: Vec<&SftExample> =
                mine.map(|i| &val.examples[b * global_batch + i]).collect();
            let batch = collate(&rows, self.tokenizer.pad_token_id)?;
            let micro = self.micro_batching(&rows)?;
            let log_probs = infer_log_probs(&mut self.engine, &batch, &micro)?;
            let mask = batch.get("response_mask")?;
            let nll = -(log_probs.f_to_kind(Kind::Double)? * mask.f_to_kind(Kind::Double)?)
                .f_sum(Kind::Double)?
                .f_double_value(&[])?;
            let tokens = mask.f_sum(Kind::Double)?.f_double_value(&[])?;
            let (nll, tokens) = self.dp_sums(nll, tokens)?;
            losses.push(if tokens > 0.0 { nll / tokens } else { 0.0 });
        }
        Ok(losses.iter().sum::<f64>() / losses.len().max(1) as f64)
    }

    /// `(a, b)` summed over the data-parallel group.
    fn dp_sums(&self, a: f64, b: f64) -> Result<(f64, f64), TrainerError> {
        let m = self
            .dp
            .mean_metrics(Metrics::from([("a".to_owned(), a), ("b".to_owned(), b)]))?;
        let n = self.dp.size() as f64;
        Ok((m["a"] * n, m["b"] * n))
    }

    fn load_checkpoint(&mut self) -> Result<(), TrainerError> {
        if self.dp.is_main() {
            checkpoint::remove_leftovers(&self.ckpt_root)?;
        }
        self.dp.barrier()?;
        let Some(dir) = checkpoint::resume_dir(&self.spec.run.resume, &self.ckpt_root)? else {
            return Ok(());
        };
        if !dir.is_dir() {
            return Err(TrainerError::Checkpoint {
                path: dir,
                msg: "no such checkpoint directory".into(),
            });
        }
        let state = checkpoint::read_state(&dir)?;
        if checkpoint::parse_step(&dir) != Some(state.global_step) {
            return Err(TrainerError::Checkpoint {
                path: dir.clone(),
                msg: format!(
                    "the directory name does not match the saved step {}",
                    state.global_step
                ),
            });
        }
        self.engine.load_checkpoint(&dir)?;
        self.sampler = BatchSampler::resume(state.sampler, self.train.len())?;
        self.global_step = state.global_step;
        self.resumed_from = state.global_step;
        self.dp.barrier()?;
        Ok(())
    }

    /// Writes this step's checkpoint into place (the tracker names it after the step's
    /// metrics are logged, [`Self::commit_checkpoint`]).
    fn save_checkpoint(&mut self) -> Result<(), TrainerError> {
        let state = TrainerState {
            global_step: self.global_step,
            sampler: self.sampler.state().clone(),
            python_sampler: None,
            kl_coef: 0.0,
        };
        let (root, step, main) = (self.ckpt_root.clone(), self.global_step, self.dp.is_main());
        let tmp = checkpoint::temp_dir(&root, step, self.ckpt_tag);
        if main {
            checkpoint::begin(&root, &tmp)?;
        }
        self.dp.barrier()?;
        self.engine.save_checkpoint(&tmp)?;
        if main {
            self.tokenizer.save(&tmp.join(crate::engine::HF_DIR))?;
            checkpoint::write_state(&tmp, &state)?;
        }
        self.dp.barrier()?;
        if main {
            checkpoint::finish(&root, step, &tmp)?;
        }
        Ok(())
    }

    fn commit_checkpoint(&mut self) -> Result<(), TrainerError> {
        if !self.dp.is_main() {
            return Ok(());
        }
        checkpoint::commit(&self.ckpt_root, self.global_step)?;
        checkpoint::apply_retention(&self.ckpt_root, self.spec.run.max_ckpt_to_keep, None)
    }
}
