//! The settings of a supervised fine-tuning run (verl's `sft_trainer`, config
//! `sft_trainer_engine`), lowered by the compiler from a checked SFT config and run by the
//! runtime's SFT loop as they are.
//!
//! An SFT run trains one model on conversations: no rollout, reward or reference policy. Its
//! engine and optimizer are the same settings types as an RL actor's ([`EngineSpec`],
//! [`OptimSpec`]); the data, batching and loop keys are SFT's own.

use serde::{Deserialize, Serialize};

use crate::algo::AlgoRelease;
use crate::binding::Binding;
use crate::data::Truncation;
use crate::trainer::{
    EngineSpec, LoggerKind, LoraSpec, OptimSpec, ResumeSpec, StrategyName, WorldSpec,
};

/// One SFT run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftSpec {
    /// What the binary is monomorphized over; the binary refuses a spec of another binding.
    pub binding: Binding,
    /// The strategy as written (`engine.strategy`).
    pub strategy: StrategyName,
    pub world: WorldSpec,
    pub data: SftDataSpec,
    pub model: SftModelSpec,
    pub batching: SftBatching,
    pub run: SftRunSpec,
    /// Whose dataset and loss semantics the run follows (the release the config was judged
    /// against).
    pub release: AlgoRelease,
    /// Which of verl's SFT trainers the run reproduces.
    #[serde(default)]
    pub trainer: SftTrainerKind,
}

/// verl's SFT trainers. They differ in how a step's rows meet the ranks, how the loss is
/// normalised and validated, and how long the lr schedule is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SftTrainerKind {
    /// The engine-based trainer (`verl.trainer.sft_trainer`, config `sft_trainer_engine`):
    /// the step's token mean over every rank.
    #[default]
    Engine,
    /// verl 0.7.0's legacy `fsdp_sft_trainer` (config `sft_trainer`): each micro-batch's
    /// token mean divided by the micro-batch count, averaged over the data-parallel ranks;
    /// rows strided over the ranks; validation in `micro_batch_size_per_gpu` rows a rank; the
    /// lr schedule spans `total_epochs` whatever `total_training_steps` says.
    Legacy {
        /// `data.balance_dp_token`: each micro-batch's loss divided by its tokens summed over
        /// every rank (times the data-parallel size) instead of its own.
        balance_dp_token: bool,
    },
}

impl SftTrainerKind {
    pub fn is_legacy(self) -> bool {
        matches!(self, SftTrainerKind::Legacy { .. })
    }
}

/// How a row of the SFT files becomes a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SftFormat {
    /// verl's `MultiTurnSFTDataset`: a list of chat messages (`messages_key`).
    #[default]
    MultiTurn,
    /// verl 0.7.0's `SFTDataset` (the legacy trainer without `data.multiturn.enable`): a
    /// prompt and a response column; the prompt rendered as one user turn with the
    /// generation prompt, the response followed by the eos token.
    SingleTurn(SingleTurnKeys),
}

/// The columns of a single-turn SFT row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SingleTurnKeys {
    /// `data.prompt_key`.
    pub prompt_key: String,
    /// `data.response_key`.
    pub response_key: String,
    /// `data.prompt_dict_keys`: the prompt is the cell's value at these keys, in turn.
    pub prompt_dict_keys: Vec<String>,
    /// `data.response_dict_keys`.
    pub response_dict_keys: Vec<String>,
}

/// How the dataset lays a row out (`pad_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SftPadding {
    /// `no_padding`: the row as it is (the engine trainer's only mode).
    #[default]
    NoPadding,
    /// `right`: padded to `max_length`; an overlong row follows `truncation` (refused, or cut
    /// on its side). The padding itself never reaches the loss, so verlc does not store it.
    Right,
}

/// The trained model (`model.*`) on its engine (`engine.*`) with its optimizer (`optim.*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftModelSpec {
    pub path: String,
    /// `model.tokenizer_path`, else the model's path.
    pub tokenizer_path: String,
    /// Seed of a built-in model's initialisation (`engine.seed`).
    pub seed: u64,
    pub engine: EngineSpec,
    pub optim: OptimSpec,
    pub lora: Option<LoraSpec>,
    /// `model.override_config`.
    #[serde(default)]
    pub config_overrides: serde_json::Map<String, serde_json::Value>,
}

/// Conversations and how they become token sequences (`data.*`; verl's multi-turn SFT
/// dataset).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftDataSpec {
    pub train_files: Vec<String>,
    pub val_files: Vec<String>,
    pub messages_key: String,
    pub tools_key: String,
    pub enable_thinking_key: String,
    /// `enable_thinking_default` (`None`: the chat template's own default).
    pub enable_thinking_default: Option<bool>,
    pub max_length: usize,
    pub truncation: Truncation,
    pub ignore_input_ids_mismatch: bool,
    /// `apply_chat_template_kwargs`.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// `train_max_samples` (`None`: verl's -1, every row).
    pub train_max_samples: Option<usize>,
    pub val_max_samples: Option<usize>,
    #[serde(default)]
    pub format: SftFormat,
    #[serde(default)]
    pub padding: SftPadding,
}

/// How a step's conversations are cut (`data.train_batch_size`, `micro_batch_size_per_gpu`,
/// `use_dynamic_bsz`, `max_token_len_per_gpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SftBatching {
    /// Conversations per optimizer step over every data-parallel rank.
    pub global_batch: usize,
    /// Rows per micro-batch on a rank (without `dynamic`).
    pub micro_batch: usize,
    /// Micro-batches formed under a token budget per rank (`max_token_len_per_gpu` times the
    /// Ulysses degree); `None`: fixed micro-batches.
    pub token_budget: Option<usize>,
}

/// The loop (`trainer.*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftRunSpec {
    pub total_epochs: u64,
    /// `total_training_steps` (`None`: every epoch over the data).
    pub total_training_steps: Option<u64>,
    /// Validate every this many steps (0: only after the last step); `after_each_epoch` is
    /// the steps of an epoch, resolved at start-up.
    pub test_freq: SftFrequency,
    pub save_freq: SftFrequency,
    /// `default_local_dir`.
    pub checkpoint_dir: String,
    pub resume: ResumeSpec,
    /// `max_ckpt_to_keep` (`None`: all).
    pub max_ckpt_to_keep: Option<usize>,
    /// The sampler's seed (verl's `DistributedSampler` default, 0; `trainer.seed` is not read
    /// by verl's SFT loop).
    pub seed: u64,
    pub project_name: String,
    pub experiment_name: String,
    pub loggers: Vec<LoggerKind>,
}

/// `save_freq` / `test_freq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SftFrequency {
    /// Never periodically (verl's non-positive values).
    Never,
    Steps(u64),
    AfterEachEpoch,
}

impl SftFrequency {
    /// The step interval once the steps of an epoch are known (`None`: never).
    pub fn every(self, steps_per_epoch: u64) -> Option<u64> {
        match self {
            SftFrequency::Never => None,
            SftFrequency::Steps(n) => Some(n).filter(|n| *n > 0),
            SftFrequency::AfterEachEpoch => Some(steps_per_epoch).filter(|n| *n > 0),
        }
    }
}

impl SftSpec {
    /// The data-parallel ranks a step's conversations are split over: the world over the
    /// ranks that share a batch (Ulysses groups under FSDP, the model-parallel grid under
    /// Megatron).
    pub fn data_parallel(&self) -> usize {
        let group = match &self.model.engine {
            EngineSpec::Fsdp(f) => f.ulysses.max(1),
            EngineSpec::Megatron(m) => {
                m.tensor_parallel.max(1) * m.pipeline_parallel.max(1) * m.context_parallel.max(1)
            }
        };
        (self.world.size() / group).max(1)
    }

    /// Optimizer steps of one epoch over `rows` conversations: verl's sampler drops the rows
    /// that do not fill every data-parallel rank, its loader the batch that is not full.
    pub fn steps_per_epoch(&self, rows: usize) -> u64 {
        let dp = self.data_parallel();
        let per_rank_rows = rows / dp;
        let per_rank_batch = (self.batching.global_batch / dp).max(1);
        (per_rank_rows / per_rank_batch) as u64
    }

    /// Steps the lr schedule spans: the run's, except under the legacy trainer, whose
    /// scheduler always spans `total_epochs` epochs (an earlier `total_training_steps` only
    /// stops the loop).
    pub fn schedule_steps(&self, rows: usize) -> u64 {
        if self.trainer.is_legacy() {
            self.steps_per_epoch(rows) * self.run.total_epochs
        } else {
            self.total_steps(rows)
        }
    }

    /// Steps of the whole run over `rows` training conversations (the legacy trainer's loop
    /// stops with its epochs, even when `total_training_steps` is larger).
    pub fn total_steps(&self, rows: usize) -> u64 {
        let epochs = self.steps_per_epoch(rows) * self.run.total_epochs;
        match self.run.total_training_steps {
            Some(n) if self.trainer.is_legacy() => n.min(epochs),
            Some(n) => n,
            None => epochs,
        }
    }

    /// Conversations of one validation batch over every rank: the training batch, or under
    /// the legacy trainer `micro_batch_size_per_gpu` a data-parallel rank.
    pub fn val_batch(&self) -> usize {
        if self.trainer.is_legacy() {
            self.batching.micro_batch * self.data_parallel()
        } else {
            self.batching.global_batch
        }
    }
}
