//! The training engine interface (verl's `BaseEngine`; docs/training-loop.md),
//! adapted: an engine owns one model (a [`Head`] on the decoder), its optimizer and its
//! lr scheduler, and runs forward/backward over micro-batches for the worker roles.
//!
//! - [`Engine`]: the interface every parallel strategy implements (the single-process
//!   [`single::SingleEngine`] here; FSDP and Megatron engines later), so workers and the
//!   trainer never see the strategy.
//! - [`Head`]: what a forward pass returns: token log-probs (and entropy) for the actor and the
//!   reference ([`CausalLm`]), values for the critic ([`ValueModel`]).
//! - [`Batch`]: named tensors sharing their rows (verl's `DataProto.batch`).
//!
//! Gradient accumulation: [`Engine::forward_backward`] computes the global-batch facts of the
//! batch it is given (valid tokens, non-empty sequences, data-parallel size; verl's
//! `global_batch_info`) and hands them to the loss as [`AggOptions`], so a loss aggregated
//! with them is already the micro-batch's share of the whole batch's loss. The engine then
//! back-propagates each micro-batch loss as it is; the accumulated gradient is the gradient of
//! the batch loss, whatever the micro-batch size.

pub mod batch;
pub mod fsdp;
pub mod hybrid;
pub mod megatron;
pub mod micro;
pub mod single;

use std::collections::BTreeMap;
use std::path::Path;

use tch::Tensor;
use tch::nn::Path as VarPath;

use crate::algo::AggOptions;
use crate::logits::logprob::{entropy_from_logits, log_probs_from_logits, response_window};
use crate::logits::topk::{
    TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS, TopK, TopKTargets, topk_columns, topk_output,
};
use crate::logits::{LogProbOutput, SequenceBatch, TokenStats, sum_pi_squared_from_logits};
use crate::model::decoder::Model;
use crate::model::packed::Packing;
use crate::model::vision::InputEmbeds;
use crate::model::{CausalLm, ModelConfig, ValueModel};
use hybrid::RolloutLayout;

pub use batch::Batch;
pub use micro::MicroBatching;
pub use single::{EngineSettings, OptimSettings, SchedulerSettings, SingleEngine};

/// Scalar metrics of one step, by verl name (ordered, so logs are deterministic).
pub type Metrics = BTreeMap<String, f64>;

/// Errors of the engines.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid batch: {0}")]
    Batch(String),
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Optim(#[from] crate::optim::OptimError),
    #[error(transparent)]
    Algo(#[from] crate::algo::AlgoError),
    #[error("vision inputs: {0}")]
    Vision(#[from] crate::model::vision::qwen2_5_vl::VisionError),
    #[error("checkpoint {}: {msg}", path.display())]
    Checkpoint {
        path: std::path::PathBuf,
        msg: String,
    },
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// How a forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForwardOptions {
    /// Logits are divided by this before log-softmax (verl passes the rollout temperature).
    pub temperature: f64,
    /// Also compute the token entropy (causal LM only).
    pub with_entropy: bool,
    /// Also compute `Σ_v π_v²` per token (causal LM only; verl 0.9's
    /// `calculate_sum_pi_squared`).
    pub with_sum_pi_squared: bool,
    /// The top-k output of on-policy distillation's `forward_kl_topk` (causal LM only).
    pub topk: TopK,
}

impl ForwardOptions {
    /// The statistics asked for besides the log-prob.
    pub fn stats(&self) -> TokenStats {
        TokenStats {
            entropy: self.with_entropy,
            sum_pi_squared: self.with_sum_pi_squared,
        }
    }
}

impl Default for ForwardOptions {
    fn default() -> Self {
        ForwardOptions {
            temperature: 1.0,
            with_entropy: false,
            with_sum_pi_squared: false,
            topk: TopK::Off,
        }
    }
}

/// A model with a head: what an engine trains or runs. The forward reads the sequence tensors
/// of a [`Batch`] (`input_ids`, `attention_mask`, `position_ids`, all `(N, P + R)`, and
/// `responses`, `(N, R)`) and returns per-response-token outputs `(N, R)`.
pub trait Head: Sized {
    type Output;
    /// Registers the model's variables under `root` (names equal the HF checkpoint's).
    fn build(cfg: &ModelConfig, root: VarPath) -> Result<Self, String>;
    fn forward(&self, batch: &Batch, opts: &ForwardOptions) -> Result<Self::Output>;
    /// `*ForCausalLM` / `*ForTokenClassification` of the config's architecture.
    fn architecture(cfg: &ModelConfig) -> Result<&'static str, String>;
    /// The decoder the head sits on.
    fn backbone(&self) -> &Model;
    /// Per-token outputs `(1, M, C)` of normed final hidden states `(1, M, hidden)` of tokens
    /// that predict `labels` `(1, M)`: the packed form of the head's output. `targets` are the
    /// teacher's top-k at the same tokens when the forward computes the top-k KL
    /// ([`ForwardOptions::topk`]).
    fn token_columns(
        &self,
        hidden: &Tensor,
        labels: &Tensor,
        targets: Option<&TopKTargets>,
        opts: &ForwardOptions,
    ) -> Result<Tensor>;
    /// The output from [`Head::token_columns`] scattered to the response grid `(N, R, C)`.
    fn output_from_columns(&self, columns: &Tensor, opts: &ForwardOptions) -> Result<Self::Output>;
    /// [`Head::forward`] on the batch's valid tokens alone (verl's `use_remove_padding`): the
    /// same outputs at every response token, without computing padding (see
    /// [`crate::model::packed`]); zero at the response positions whose
    /// predicting position is padding.
    fn forward_packed(&self, batch: &Batch, opts: &ForwardOptions) -> Result<Self::Output> {
        let (seq, r) = sequences(batch)?;
        let t = seq.input_ids.size()[1];
        let packing = Packing::new(seq.attention_mask).map_err(EngineError::Batch)?;
        let window = packing.window(t - r - 1, r);
        let hidden = match self.input_embeds(batch)? {
            Some(x) => self.backbone().forward_packed_window_embeds(
                &x,
                seq.position_ids,
                &packing,
                &window,
            ),
            None => self.backbone().forward_packed_window(
                seq.input_ids,
                seq.position_ids,
                &packing,
                &window,
            ),
        };
        let targets = topk_targets(batch, opts)?
            .map(|t| t.pack(&window.dest))
            .transpose()?;
        let columns = self.token_columns(
            &hidden,
            &window.labels(seq.input_ids),
            targets.as_ref(),
            opts,
        )?;
        self.output_from_columns(&window.unpack(&columns), opts)
    }
    /// Variable-name prefixes a checkpoint of the base model may lack (the fresh value head).
    fn fresh_prefixes() -> Vec<String> {
        Vec::new()
    }
    fn config(&self) -> &ModelConfig;
    /// The input embeddings `(B, T, hidden)` of a batch whose rows carry images (a
    /// vision-language model's: the tower's embeddings in the placeholders, and its DeepStack
    /// features); `None` when the token embeddings are all there is.
    fn input_embeds(&self, _batch: &Batch) -> Result<Option<InputEmbeds>> {
        Ok(None)
    }
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

/// The teacher's top-k on the response grid `(N, R, K)`, when `opts` asks for the top-k KL.
pub(crate) fn topk_targets(batch: &Batch, opts: &ForwardOptions) -> Result<Option<TopKTargets>> {
    if !matches!(opts.topk, TopK::KlToTeacher { .. }) {
        return Ok(None);
    }
    Ok(Some(TopKTargets {
        ids: batch.get(TEACHER_TOPK_IDS)?.f_to_kind(tch::Kind::Int64)?,
        log_probs: batch.get(TEACHER_TOPK_LOG_PROBS)?.shallow_clone(),
    }))
}

fn sequences(batch: &Batch) -> Result<(SequenceBatch<'_>, i64)> {
    let (_, r) = lengths(batch)?;
    let seq = SequenceBatch {
        input_ids: batch.get("input_ids")?,
        attention_mask: batch.get("attention_mask")?,
        position_ids: batch.get("position_ids")?,
    };
    Ok((seq, r))
}

// The negated comparison also rejects NaN.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub(crate) fn check_temperature(temperature: f64) -> Result<()> {
    if !(temperature > 0.0) {
        return Err(EngineError::Config(format!(
            "temperature must be positive, got {temperature}"
        )));
    }
    Ok(())
}

impl Head for CausalLm {
    /// Log-probs `(N, R)` of the response tokens and, if asked, their entropy, both f32.
    type Output = LogProbOutput;

    fn build(cfg: &ModelConfig, root: VarPath) -> Result<Self, String> {
        CausalLm::new(cfg, root)
    }

    fn forward(&self, batch: &Batch, opts: &ForwardOptions) -> Result<LogProbOutput> {
        let (seq, r) = sequences(batch)?;
        check_temperature(opts.temperature)?;
        let (hidden, labels) = match self.input_embeds(batch)? {
            Some(x) => {
                let t = seq.input_ids.size()[1];
                let hidden = self.model.forward_window_embeds(
                    x,
                    seq.position_ids,
                    seq.attention_mask,
                    t - r - 1,
                    r,
                );
                (hidden, seq.input_ids.f_narrow(1, t - r, r)?)
            }
            None => response_window(self, &seq, r),
        };
        let targets = topk_targets(batch, opts)?;
        let columns = self.token_columns(&hidden, &labels, targets.as_ref(), opts)?;
        self.output_from_columns(&columns, opts)
    }

    fn architecture(cfg: &ModelConfig) -> Result<&'static str, String> {
        Ok(cfg.arch()?.causal_lm_class())
    }

    fn backbone(&self) -> &Model {
        &self.model
    }

    /// Log-prob, then entropy and `Σπ²` when asked, then the top-k's columns.
    fn token_columns(
        &self,
        hidden: &Tensor,
        labels: &Tensor,
        targets: Option<&TopKTargets>,
        opts: &ForwardOptions,
    ) -> Result<Tensor> {
        check_temperature(opts.temperature)?;
        let mut logits = self.logits(hidden);
        if opts.temperature != 1.0 {
            logits /= opts.temperature;
        }
        let mut cols = vec![log_probs_from_logits(&logits, labels)];
        if opts.with_entropy {
            cols.push(entropy_from_logits(&logits));
        }
        if opts.with_sum_pi_squared {
            cols.push(sum_pi_squared_from_logits(&logits));
        }
        let stats = Tensor::f_stack(&cols, -1)?;
        match topk_columns(&logits, opts.topk, targets)? {
            Some(topk) => Ok(Tensor::f_cat(&[stats, topk], -1)?),
            None => Ok(stats),
        }
    }

    fn output_from_columns(
        &self,
        columns: &Tensor,
        opts: &ForwardOptions,
    ) -> Result<LogProbOutput> {
        let entropy = if opts.with_entropy {
            Some(columns.f_select(-1, 1)?)
        } else {
            None
        };
        let sum_pi_squared = if opts.with_sum_pi_squared {
            Some(columns.f_select(-1, 1 + i64::from(opts.with_entropy))?)
        } else {
            None
        };
        let stats = 1 + opts.stats().count();
        let topk = topk_output(
            &columns.f_narrow(-1, stats, opts.topk.columns())?,
            opts.topk,
        )?;
        Ok(LogProbOutput {
            log_probs: columns.f_select(-1, 0)?,
            entropy,
            sum_pi_squared,
            topk,
        })
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn input_embeds(&self, batch: &Batch) -> Result<Option<InputEmbeds>> {
        vision_embeds(self.vision.as_ref(), &self.model, batch)
    }
}

impl Head for ValueModel {
    /// Values `(N, R)` in f32 of the states that predict each response token (verl's
    /// `values[:, -R-1:-1]`).
    type Output = Tensor;

    fn build(cfg: &ModelConfig, root: VarPath) -> Result<Self, String> {
        ValueModel::new(cfg, root)
    }

    fn forward(&self, batch: &Batch, _opts: &ForwardOptions) -> Result<Tensor> {
        let (seq, r) = sequences(batch)?;
        Ok(match self.input_embeds(batch)? {
            Some(x) => self.response_values_embeds(x, seq.position_ids, seq.attention_mask, r),
            None => self.response_values(seq.input_ids, seq.position_ids, seq.attention_mask, r),
        })
    }

    fn architecture(cfg: &ModelConfig) -> Result<&'static str, String> {
        Ok(cfg.arch()?.value_class())
    }

    fn backbone(&self) -> &Model {
        &self.model
    }

    /// The value.
    fn token_columns(
        &self,
        hidden: &Tensor,
        _: &Tensor,
        _: Option<&TopKTargets>,
        _: &ForwardOptions,
    ) -> Result<Tensor> {
        Ok(self.score().forward(hidden).f_to_kind(tch::Kind::Float)?)
    }

    fn output_from_columns(&self, columns: &Tensor, _: &ForwardOptions) -> Result<Tensor> {
        Ok(columns.f_select(-1, 0)?)
    }

    fn fresh_prefixes() -> Vec<String> {
        vec!["score.".to_owned()]
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn input_embeds(&self, batch: &Batch) -> Result<Option<InputEmbeds>> {
        vision_embeds(self.vision.as_ref(), &self.model, batch)
    }
}

/// The input embeddings of `batch` when its rows carry images and the model has a `vision`
/// tower (the actor's and the critic's alike).
fn vision_embeds(
    vision: Option<&crate::model::vision::Vision>,
    model: &Model,
    batch: &Batch,
) -> Result<Option<InputEmbeds>> {
    match vision {
        Some(vision) if !batch.images().is_empty() => {
            let (t, r) = lengths(batch)?;
            Ok(Some(vision.embed(
                model,
                batch.get("input_ids")?,
                t - r,
                &batch.all_images(),
            )?))
        }
        _ => Ok(None),
    }
}

/// What the loss of one micro-batch returns: the scalar to back-propagate (already
/// normalised with the [`AggOptions`] it was given) and its metrics.
#[derive(Debug)]
pub struct MicroLoss {
    pub loss: Tensor,
    pub metrics: Metrics,
}

/// The loss function of [`Engine::forward_backward`]: micro-batch, the head's output on it,
/// and the global-batch normalisation.
pub type LossFn<'a, O> = dyn FnMut(&Batch, O, &AggOptions) -> Result<MicroLoss> + 'a;

/// Result of [`Engine::optimizer_step`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepResult {
    /// Global L2 norm of the gradient before clipping (`None`: the step was skipped for
    /// inf/nan gradients before the norm was taken).
    pub grad_norm: Option<f64>,
    pub update_successful: bool,
}

/// The engine interface (verl's `BaseEngine`), strategy-neutral. `dp_*` describe the
/// data-parallel group the engine's batches are split over (1 and 0 for a single process).
pub trait Engine {
    type Head: Head;

    /// The model's configuration (architecture and sizes).
    fn model_config(&self) -> &ModelConfig;

    /// Turns the model's LoRA adapters off or on (the reference policy of a LoRA actor is the
    /// actor without them). An error where the engine holds no adapters.
    fn set_adapters_enabled(&self, enabled: bool) -> Result<()>;

    /// Runs the forward pass over `batch` in the micro-batches `micro` cuts, calls `loss` on
    /// each and back-propagates the result (gradients accumulate; call
    /// [`Engine::optimizer_zero_grad`] first). Returns each micro-batch's metrics.
    fn forward_backward(
        &mut self,
        batch: &Batch,
        micro: &MicroBatching,
        fwd: &ForwardOptions,
        loss: &mut LossFn<'_, <Self::Head as Head>::Output>,
    ) -> Result<Vec<Metrics>>;

    /// Forward without gradients in micro-batches (verl's `infer_batch`); the outputs are in
    /// micro-batch order (see [`MicroBatching::restore`]).
    fn infer_batch(
        &mut self,
        batch: &Batch,
        micro: &MicroBatching,
        fwd: &ForwardOptions,
    ) -> Result<Vec<<Self::Head as Head>::Output>>;

    fn optimizer_zero_grad(&mut self) -> Result<()>;

    /// Clips to the configured norm and steps; skips (and zeroes the gradients) when the norm
    /// is not finite. Returns the norm before clipping.
    fn optimizer_step(&mut self) -> Result<StepResult>;

    /// Advances the lr schedule by one optimizer step; returns the lr the next step uses.
    fn lr_scheduler_step(&mut self) -> Result<f64>;

    /// The lr the next optimizer step uses.
    fn lr(&self) -> f64;

    /// Writes model (HF layout), optimizer and scheduler state under `dir`.
    fn save_checkpoint(&self, dir: &Path) -> Result<()>;
    /// Restores what [`Engine::save_checkpoint`] wrote.
    fn load_checkpoint(&mut self, dir: &Path) -> Result<()>;

    /// Every parameter by checkpoint name, as full tensors (verl's `get_per_tensor_param`;
    /// collective on sharded engines).
    fn per_tensor_params(&self) -> Result<Vec<(String, Tensor)>>;

    /// Overwrites every parameter from full tensors by checkpoint name (what
    /// [`Engine::per_tensor_params`] returns), and the optimizer's main copies of them; the
    /// optimizer's moments and the schedule are kept. Every parameter must be given.
    fn load_params(&mut self, named: &[(String, Tensor)]) -> Result<()>;

    /// The hybrid engine's rollout model on this rank, for the rollout's tensor parallel size
    /// (`None`: the engine's own layout): the whole model by default, where the size changes
    /// nothing. Collective on engines that build groups for it; call it once, on every rank,
    /// before [`Engine::rollout_weights`].
    fn rollout_layout(&mut self, tensor_parallel: Option<usize>) -> Result<RolloutLayout> {
        let _ = tensor_parallel;
        Ok(RolloutLayout::Full(self.model_config().clone()))
    }

    /// What the rollout model of [`Engine::rollout_layout`] binds after an update: the full
    /// weights by default, this rank's shards for a sharded layout.
    fn rollout_weights(&self) -> Result<Vec<(String, Tensor)>> {
        self.per_tensor_params()
    }

    fn dp_size(&self) -> usize {
        1
    }
    fn dp_rank(&self) -> usize {
        0
    }
    /// The largest `n` over every rank of the run (verl syncs dynamic micro-batch counts over
    /// the default group); `n` in one process.
    fn max_over_ranks(&self, n: usize) -> Result<usize> {
        Ok(n)
    }
}

/// Where a checkpoint keeps the model: `huggingface/` (config and weights, loadable by
/// transformers) and, with LoRA, `lora_adapter/` (PEFT's adapter directory; the Hugging Face
/// directory then holds the frozen base weights, as verl's checkpoints do).
pub const HF_DIR: &str = "huggingface";
pub const ADAPTER_DIR: &str = "lora_adapter";

/// Writes the model part of a checkpoint into `dir` (see [`HF_DIR`]); `base_model` names the
/// model the adapters were trained on.
pub(crate) fn save_model(
    dir: &Path,
    params: &[(String, Tensor)],
    config: &ModelConfig,
    arch: &str,
    base_model: &str,
) -> Result<()> {
    let base: Vec<(String, Tensor)> = params
        .iter()
        .filter(|(n, _)| !crate::model::lora::is_adapter(n))
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    crate::model::save::save_named(
        &base,
        config,
        arch,
        &dir.join(HF_DIR),
        &crate::model::SaveOptions::default(),
    )?;
    if let Some(lora) = &config.lora {
        let vision = config.arch().is_ok_and(|a| a.has_vision());
        crate::model::lora::save_adapter(&dir.join(ADAPTER_DIR), params, lora, base_model, vision)?;
    }
    Ok(())
}

/// The global-batch normalisation of `batch` for `loss_agg_mode` (verl's `global_batch_info`
/// over one data-parallel rank; multi-rank engines all-reduce these counts).
pub fn global_agg_options(
    batch: &Batch,
    dp_size: usize,
    loss_scale_factor: Option<f64>,
) -> Result<AggOptions> {
    let tokens = batch.num_tokens()?;
    let seqs = batch.num_nonempty()?;
    // The release's semantics are the worker's to set (its loss settings carry them).
    Ok(AggOptions {
        dp_size,
        batch_num_tokens: (tokens > 0.0).then_some(tokens),
        global_batch_size: (seqs > 0.0).then_some(seqs),
        loss_scale_factor,
        ..AggOptions::default()
    })
}
