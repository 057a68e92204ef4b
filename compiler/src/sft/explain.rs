//! `verlc explain` for an SFT config: the batch arithmetic verl's SFT trainer derives.

use serde::Serialize;

use super::SftConfig;

#[derive(Debug, Serialize)]
pub struct SftExplanation {
    pub trainer: &'static str,
    /// `trainer.nnodes × n_gpus_per_node` when the config states them; `None`: the launcher's
    /// (torchrun's `--nnodes × --nproc_per_node`), which verl's torchrun entry reads instead.
    pub world_size: Option<i64>,
    /// Ranks that share one batch (Ulysses, or Megatron's TP × PP × CP); `None` for engines
    /// whose layout verlc does not derive.
    pub model_parallel: Option<i64>,
    pub data_parallel: Option<i64>,
    pub train_batch_size: i64,
    /// `data.train_batch_size // dp`: samples each data-parallel rank trains a step.
    pub samples_per_rank: Option<i64>,
    /// `samples_per_rank × dp`: the samples a step trains (the rest of the batch is not).
    pub samples_per_step: Option<i64>,
    /// Without dynamic batching: micro-batches (gradient-accumulation steps) per rank and step.
    pub micro_batches_per_step: Option<i64>,
    /// With dynamic batching: a rank's token budget per micro-batch
    /// (`max_token_len_per_gpu × Ulysses`).
    pub token_budget_per_micro_batch: Option<i64>,
    /// At most `samples_per_step × max_length` tokens a step.
    pub max_tokens_per_step: i64,
    /// `trainer.total_training_steps` when set; else verl counts the data's rows:
    /// `rows // samples_per_step × total_epochs`.
    pub total_training_steps: Option<i64>,
    pub total_epochs: i64,
    pub loss: &'static str,
    /// Rows padded to `max_length` (the legacy trainer): a step computes exactly
    /// `max_tokens_per_step` positions.
    pub padded: bool,
}

pub fn explain(c: &SftConfig) -> SftExplanation {
    let dp = c.data_parallel().filter(|d| *d > 0);
    let samples_per_rank = dp.map(|dp| c.train_batch_size / dp);
    let samples_per_step = dp.zip(samples_per_rank).map(|(d, n)| n.saturating_mul(d));
    let (trainer, loss) = if c.is_legacy() {
        (
            "verl 0.7.0's legacy SFT trainer (fsdp_sft_trainer, config sft_trainer)",
            "each micro-batch's token-mean negative log-likelihood over its assistant tokens, averaged over the micro-batches and ranks (data.balance_dp_token: over every rank's tokens of the micro-batch)",
        )
    } else {
        (
            "verl's SFT trainer (sft_trainer_engine)",
            "token-mean negative log-likelihood over every assistant token of the step (all ranks and micro-batches)",
        )
    };
    SftExplanation {
        trainer,
        world_size: c.world_stated.then(|| c.world()),
        model_parallel: c.engine.model_parallel(),
        data_parallel: dp,
        train_batch_size: c.train_batch_size,
        samples_per_rank,
        samples_per_step,
        micro_batches_per_step: samples_per_rank
            .filter(|_| !c.use_dynamic_bsz && c.micro_batch_size_per_gpu > 0)
            .map(|n| n / c.micro_batch_size_per_gpu),
        token_budget_per_micro_batch: c.use_dynamic_bsz.then(|| c.token_budget()),
        max_tokens_per_step: samples_per_step
            .unwrap_or(c.train_batch_size)
            .saturating_mul(c.max_length),
        total_training_steps: c.total_training_steps,
        total_epochs: c.total_epochs,
        loss,
        padded: c.is_legacy(),
    }
}

/// The explanation as text.
pub fn human(e: &SftExplanation) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<27}{v}\n"));
    line("trainer", e.trainer.to_owned());
    match (e.world_size, e.data_parallel) {
        (Some(w), Some(dp)) => line(
            "ranks",
            format!("{w} = {dp} data-parallel × {} sharing a batch", w / dp.max(1)),
        ),
        (Some(w), None) => line("ranks", format!("{w} (the engine's layout is not derived)")),
        _ => line(
            "ranks",
            "the launcher's (torchrun --nnodes × --nproc_per_node); set trainer.nnodes and trainer.n_gpus_per_node to have the arithmetic per rank".to_owned(),
        ),
    }
    match (e.samples_per_step, e.samples_per_rank) {
        (Some(step), Some(rank)) => line(
            "samples per step",
            format!("{step} ({rank} per data-parallel rank)"),
        ),
        _ => line(
            "samples per step",
            format!(
                "{} (data.train_batch_size, split over the data-parallel ranks)",
                e.train_batch_size
            ),
        ),
    }
    match (e.micro_batches_per_step, e.token_budget_per_micro_batch) {
        (Some(n), _) => line(
            "micro-batches per step",
            format!("{n} per rank (gradient accumulation)"),
        ),
        (None, Some(b)) => line(
            "micro-batches per step",
            format!("dynamic: at most {b} tokens each"),
        ),
        _ => {}
    }
    line(
        "tokens per step",
        if e.padded {
            format!(
                "{} (every row padded to data.max_length)",
                e.max_tokens_per_step
            )
        } else {
            format!("at most {}", e.max_tokens_per_step)
        },
    );
    line(
        "training steps",
        match e.total_training_steps {
            Some(n) => format!("{n} (trainer.total_training_steps)"),
            None => format!(
                "rows of data.train_files // samples per step × {} epoch(s) (verl counts the data)",
                e.total_epochs
            ),
        },
    );
    line("loss", e.loss.to_owned());
    out
}
