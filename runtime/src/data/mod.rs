//! Prompt datasets: verl's RL format (parquet or JSON; columns `prompt`, `data_source`,
//! `reward_model.ground_truth`, `extra_info`, …) and built-in synthetic tasks addressed as
//! `builtin://digit_reversal?split=train`, tokenized with the chat template, truncated or
//! filtered to `max_prompt_length`, and sampled in seeded, resumable batches.
//!
//! - [`files`]: rows of a file or `builtin://` address; [`parquet`] reads parquet without arrow.
//! - [`sample`]: a row as a typed [`Sample`].
//! - [`dataset`]: [`RlDataset`] (tokenization, truncation, `filter_overlong_prompts`, max samples).
//! - [`sampler`]: [`BatchSampler`] with a serializable [`SamplerState`].
//! - [`builtin`]: the synthetic tasks and their rule rewards ([`builtin::compute_score`]).
//! - [`sft`]: [`SftDataset`], verl's multi-turn SFT conversations with their loss masks.

pub mod builtin;
pub mod dataset;
pub mod files;
pub mod parquet;
pub mod sample;
pub mod sampler;
pub mod sft;

use std::path::PathBuf;

pub use dataset::{DatasetOptions, PromptItem, RlDataset, Truncation};
pub use sample::{RewardSpec, Sample};
pub use sampler::{BatchSampler, SamplerState};
pub use sft::{SftDataset, SftExample, SftOptions};

/// Errors of dataset reading and preparation; file errors name the file, row errors the row.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {msg}", file.display())]
    Parquet { file: PathBuf, msg: String },
    #[error("{}: invalid JSON: {msg}", file.display())]
    Json { file: PathBuf, msg: String },
    #[error("{}: unsupported file format (expected .parquet, .json or .jsonl)", file.display())]
    Format { file: PathBuf },
    #[error("{file}: row {row}: {msg}")]
    Row {
        file: String,
        row: usize,
        msg: String,
    },
    #[error("{0}")]
    Builtin(String),
    #[error(
        "{file}: row {row}: prompt is {len} tokens, longer than max_prompt_length = {max} (truncation = error; set data.truncation or data.filter_overlong_prompts)"
    )]
    TooLong {
        file: String,
        row: usize,
        len: usize,
        max: usize,
    },
    #[error("{file}: row {row}: {source}")]
    Tokenize {
        file: String,
        row: usize,
        source: crate::tokenizer::TokenizerError,
    },
    #[error("measuring the chat template's system and generation prompts: {0}")]
    ChatPrompts(crate::tokenizer::TokenizerError),
    #[error("dataset is empty{0}")]
    Empty(String),
    #[error("sampler state: {0}")]
    State(String),
}
