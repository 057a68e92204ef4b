//! `verlc explain` for an SFT config: the batch arithmetic verl's SFT trainer derives, and
//! with the model's `config.json` a per-rank memory estimate of its engine (the same model of
//! memory as the RL actor's, `crate::explain`: FSDP shards of params, grads and AdamW moments
//! in `model_dtype`, or Megatron's bf16 params with fp32 main grads and a distributed
//! optimizer; activations for one micro-batch, with or without recompute; fp32 logits).

use serde::Serialize;

use super::SftConfig;
use crate::explain::{MemoryBreakdown, MemoryEstimate, activations, logits, place};
use crate::rules::ModelDims;

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
    /// Per rank, with the model's dimensions and a stated world.
    pub memory: Option<MemoryEstimate>,
    pub notes: Vec<String>,
}

pub fn explain(c: &SftConfig, model: Option<&ModelDims>) -> SftExplanation {
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
        memory: None,
        notes: Vec::new(),
    }
    .with_memory(c, model)
}

impl SftExplanation {
    fn with_memory(mut self, c: &SftConfig, model: Option<&ModelDims>) -> Self {
        match (model, c.data_parallel().filter(|d| *d > 0)) {
            (None, _) => self.notes.push(
                "no model config.json found (model.path is no local checkpoint or cached Hub model): pass --model-config PATH for a memory estimate".into(),
            ),
            (Some(_), None) => self.notes.push(
                "state trainer.nnodes and trainer.n_gpus_per_node (the world torchrun will start) for a per-rank memory estimate".into(),
            ),
            (Some(m), Some(dp)) => self.memory = Some(memory(c, m, dp)),
        }
        self
    }
}

/// The engine's memory per rank (module docs).
fn memory(c: &SftConfig, m: &ModelDims, dp: i64) -> MemoryEstimate {
    let h = m.hidden_size;
    let layers = m.num_hidden_layers;
    let p = m
        .all_layers_params()
        .saturating_add(m.embedding_params())
        .saturating_add(m.head_params())
        .saturating_add(h);
    let (mut dev, mut host) = (MemoryBreakdown::default(), MemoryBreakdown::default());
    let mut assumptions = Vec::new();
    let dp = dp.max(1) as u64;
    // Tokens of one micro-batch on a rank: the dynamic budget, or the micro-batch's rows at
    // their longest.
    let max_len = c.max_length.max(1) as u64;
    let micro_tokens = if c.use_dynamic_bsz {
        c.token_budget().max(1) as u64
    } else {
        c.micro_batch_size_per_gpu.max(1) as u64 * max_len
    };
    let checkpointing = c.gradient_checkpointing;
    let e = &c.engine;
    if e.is_megatron() {
        let (tp, pp, cp) = (
            e.tensor_parallel.max(1) as u64,
            e.pipeline_parallel.max(1) as u64,
            e.context_parallel.max(1) as u64,
        );
        let layers_here = layers.div_ceil(pp);
        let stage = if pp == 1 {
            p
        } else {
            layers_here
                .saturating_mul(m.layer_params())
                .saturating_add(m.embedding_params().max(m.head_params() + h))
        };
        let shard = stage / tp;
        let opt = if e.distributed_optimizer {
            shard * 12 / (dp * cp)
        } else {
            shard * 12
        };
        place(
            &mut dev,
            &mut host,
            e.param_offload,
            |b| &mut b.params_bytes,
            shard * 2,
        );
        place(
            &mut dev,
            &mut host,
            e.param_offload,
            |b| &mut b.grads_bytes,
            shard * 4,
        );
        place(
            &mut dev,
            &mut host,
            e.optimizer_offload,
            |b| &mut b.optimizer_bytes,
            opt,
        );
        assumptions.push(format!(
            "Megatron: bf16 params and fp32 main grads of the busiest pipeline stage ({layers_here} of {layers} layers) over tp={tp}; fp32 main params + 2 Adam moments{}",
            if e.distributed_optimizer { format!(" sharded over dp={dp} x cp={cp}") } else { String::new() }
        ));
        dev.activations_bytes =
            activations(micro_tokens / (tp * cp), h, layers_here, checkpointing)
                + logits(micro_tokens / cp, m.vocab_size.div_ceil(tp));
    } else {
        let sp = e.sequence_parallel().max(1) as u64;
        let shard_n = dp * sp;
        let shard = p.div_ceil(shard_n);
        let bf16_main = matches!(e.model_dtype.as_str(), "bf16" | "bfloat16");
        let bytes = if bf16_main { 2 } else { 4 };
        place(
            &mut dev,
            &mut host,
            e.param_offload,
            |b| &mut b.params_bytes,
            shard * bytes,
        );
        place(
            &mut dev,
            &mut host,
            e.param_offload,
            |b| &mut b.grads_bytes,
            shard * bytes,
        );
        place(
            &mut dev,
            &mut host,
            e.optimizer_offload,
            |b| &mut b.optimizer_bytes,
            shard * bytes * 2,
        );
        // One gathered decoder layer in bf16 while it runs, plus the prefetched next one.
        dev.params_bytes += m.layer_params() * 2 * 2;
        let main = if bf16_main { "bf16" } else { "fp32" };
        assumptions.push(format!(
            "FSDP full shard over {shard_n} ranks: {main} params, grads and 2 AdamW moments per shard (model_dtype); bf16 compute with one layer gathered (plus prefetch)"
        ));
        // Ulysses splits each micro-batch's tokens over its group.
        let local = micro_tokens.div_ceil(sp);
        dev.activations_bytes =
            activations(local, h, layers, checkpointing) + logits(local, m.vocab_size);
        if sp > 1 {
            assumptions.push(format!(
                "Ulysses {sp}: each rank's activations and logits cover 1/{sp} of the micro-batch's tokens"
            ));
        }
    }
    if c.lora_rank > 0 {
        assumptions.push(
            "LoRA: counted as full training (the adapters' own state is small; frozen weights keep no grads or moments, so this overstates)".into(),
        );
    }
    assumptions.push(format!(
        "activations for one micro-batch of {micro_tokens} tokens/rank, {}",
        if checkpointing {
            "layers recomputed in the backward pass"
        } else {
            "no recompute"
        }
    ));
    MemoryEstimate {
        params: p,
        active_params: None,
        device: dev,
        host,
        assumptions,
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
