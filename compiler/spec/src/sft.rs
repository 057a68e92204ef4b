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

    /// Steps of the whole run over `rows` training conversations.
    pub fn total_steps(&self, rows: usize) -> u64 {
        self.run
            .total_training_steps
            .unwrap_or_else(|| self.steps_per_epoch(rows) * self.run.total_epochs)
    }
}
