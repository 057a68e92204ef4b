//! verl 0.7.0's legacy SFT trainer (`verl.trainer.fsdp_sft_trainer`, config `sft_trainer`):
//! the step and the validation where it differs from the engine-based trainer.
//!
//! - A rank's rows are cut into micro-batches of `micro_batch_size_per_gpu`; each micro-batch's
//!   loss is its own token mean over the micro-batch count ([`sft_loss_legacy`]), so the
//!   update is the mean of the micro-batches' token means, averaged over the ranks.
//!   `balance_dp_token` divides by the micro-batch's tokens summed over every rank (verl
//!   all-reduces over the whole world, so under Ulysses each group's tokens count once per
//!   rank of the group, as here) times the data-parallel size.
//! - `train/loss` is the sum of a rank's micro-batch losses averaged over the ranks;
//!   `train/lr(1e-3)` the lr after the step's scheduler step, times 1000; `train/time(s)` the
//!   step's wall time.
//! - Validation reads `micro_batch_size_per_gpu` rows a rank per batch, the rows strided over
//!   the ranks in file order (verl's `DistributedSampler` without shuffling, the rows that do
//!   not fill a batch on every rank dropped); `val/loss` is the mean over batches of each
//!   batch's token mean averaged over the ranks.

use tch::Kind;

use crate::algo::sft_loss::sft_loss_legacy;
use crate::data::sft::SftExample;
use crate::engine::{Engine, Metrics, MicroBatching};
use crate::trainer::TrainerError;
use crate::trainer::parallel::Roles;

use super::{SftTrainer, collate, infer_log_probs};

/// Tokens the loss is taken over in each micro-batch of `rows` (the first token of a row
/// never is).
fn micro_tokens(rows: &[&SftExample], micro: usize) -> Vec<f64> {
    rows.chunks(micro.max(1))
        .map(|c| {
            c.iter()
                .map(|r| r.loss_mask.iter().skip(1).filter(|m| **m).count() as f64)
                .sum()
        })
        .collect()
}

impl<R: Roles> SftTrainer<R> {
    /// The divisors of each micro-batch's loss and their scale (module docs).
    fn legacy_divisors(
        &self,
        tokens: Vec<f64>,
        balance_dp_token: bool,
    ) -> Result<(Vec<f64>, f64), TrainerError> {
        if balance_dp_token {
            Ok((self.dp.world_sums(&tokens)?, self.dp.size() as f64))
        } else {
            Ok((tokens, 1.0))
        }
    }

    /// One optimizer step of the legacy trainer; its `train/*` metrics.
    pub(super) fn legacy_train_step(
        &mut self,
        balance_dp_token: bool,
    ) -> Result<Metrics, TrainerError> {
        let started = std::time::Instant::now();
        let index = self.next_rows()?;
        let rows: Vec<&SftExample> = index.iter().map(|&i| &self.train.examples[i]).collect();
        let batch = collate(&rows, self.tokenizer.pad_token_id)?;
        let micro = self.spec.batching.micro_batch.max(1);
        let (divisors, scale) =
            self.legacy_divisors(micro_tokens(&rows, micro), balance_dp_token)?;
        let micro_batches = divisors.len();
        self.engine.optimizer_zero_grad()?;
        let local = self.backward_micro_batches(
            &batch,
            &MicroBatching::Rows(micro),
            |i, log_probs, mask, _| {
                let tokens = divisors.get(i).copied().unwrap_or(0.0);
                sft_loss_legacy(log_probs, mask, tokens, scale, micro_batches)
            },
        )?;
        self.engine.optimizer_step()?;
        self.engine.lr_scheduler_step()?;
        let mut metrics = self
            .dp
            .mean_metrics(Metrics::from([("train/loss".to_owned(), local)]))?;
        metrics.insert("train/lr(1e-3)".into(), self.engine.lr() * 1e3);
        metrics.insert("train/time(s)".into(), started.elapsed().as_secs_f64());
        Ok(metrics)
    }

    /// The legacy trainer's `val/loss` (module docs).
    pub(super) fn legacy_validate(&mut self, balance_dp_token: bool) -> Result<f64, TrainerError> {
        let Some(val) = self.val.as_ref() else {
            return Ok(f64::NAN);
        };
        let micro = self.spec.batching.micro_batch.max(1);
        let (ranks, rank) = (self.dp.size(), self.dp.rank());
        let batches = val.len() / ranks / micro;
        let mut losses = Vec::with_capacity(batches);
        for b in 0..batches {
            let rows: Vec<&SftExample> = (0..micro)
                .map(|j| &val.examples[(b * micro + j) * ranks + rank])
                .collect();
            let batch = collate(&rows, self.tokenizer.pad_token_id)?;
            let log_probs = infer_log_probs(&mut self.engine, &batch, &MicroBatching::Rows(micro))?
                .f_to_kind(Kind::Double)?;
            let mask = batch.get("response_mask")?;
            let tokens = mask.f_sum(Kind::Double)?.f_double_value(&[])?;
            let (divisors, scale) = self.legacy_divisors(vec![tokens], balance_dp_token)?;
            let loss =
                sft_loss_legacy(&log_probs, mask, divisors[0], scale, 1)?.f_double_value(&[])?;
            let mean = self
                .dp
                .mean_metrics(Metrics::from([("val/loss".to_owned(), loss)]))?;
            losses.push(mean["val/loss"]);
        }
        Ok(losses.iter().sum::<f64>() / losses.len().max(1) as f64)
    }
}
