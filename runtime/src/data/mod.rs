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
//! - [`python`]: the user's dataset and sampler classes, run in a Python helper.
//! - [`sft`]: [`SftDataset`], verl's multi-turn SFT conversations with their loss masks.

pub mod builtin;
pub mod dataset;
pub mod files;
pub mod image;
pub mod parquet;
pub mod python;
pub mod sample;
pub mod sampler;
pub mod sft;
pub mod sft_single_turn;
pub mod video;
pub mod video_file;
pub mod vision_prompt;

use std::path::PathBuf;

pub use dataset::{DatasetOptions, PromptItem, RlDataset, Truncation, VisionData};
pub use sample::{RewardSpec, Sample};
pub use sampler::{BatchSampler, SamplerState};
pub use sft::{SftDataset, SftExample, SftOptions};

/// The bad rows of a dataset, found in one pass over every row: each distinct problem (a row
/// error's message in one file; too long; not tokenizable) once, at its first row, with the
/// number of other rows that have it. At most [`RowProblems::SHOWN`] problems are listed.
#[derive(Debug, Default)]
pub struct RowProblems {
    /// (first occurrence, how many more rows have the same problem, its kind).
    groups: Vec<(DataError, usize, String)>,
    /// Problems beyond the listed ones, rows counted.
    unlisted: usize,
}

impl RowProblems {
    pub const SHOWN: usize = 10;

    /// Adds a row's problem.
    pub fn push(&mut self, e: DataError) {
        let kind = match &e {
            DataError::Row { file, msg, .. } => format!("{file}\0row\0{msg}"),
            DataError::TooLong { file, .. } => format!("{file}\0too long"),
            DataError::Tokenize { file, source, .. } => format!("{file}\0tokenize\0{source}"),
            other => other.to_string(),
        };
        if let Some(g) = self.groups.iter_mut().find(|g| g.2 == kind) {
            g.1 += 1;
        } else if self.groups.len() < Self::SHOWN {
            self.groups.push((e, 0, kind));
        } else {
            self.unlisted += 1;
        }
    }

    /// Rows with a problem.
    pub fn rows(&self) -> usize {
        self.groups.iter().map(|g| 1 + g.1).sum::<usize>() + self.unlisted
    }

    /// No problem: `Ok`; one: that error as it is; more: [`DataError::Rows`].
    pub fn into_result(mut self) -> Result<(), DataError> {
        match (self.groups.len(), self.rows()) {
            (0, _) => Ok(()),
            (1, 1) => Err(self.groups.remove(0).0),
            _ => Err(DataError::Rows(self)),
        }
    }
}

impl std::fmt::Display for RowProblems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} rows cannot be used:", self.rows())?;
        for (e, same, _) in &self.groups {
            write!(f, "\n  {e}")?;
            if *same > 0 {
                write!(f, " (and {same} more rows like it)")?;
            }
        }
        if self.unlisted > 0 {
            write!(f, "\n  and {} rows with other problems", self.unlisted)?;
        }
        Ok(())
    }
}

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
    /// Several rows cannot be used: the first of each kind of problem, with how many rows share
    /// it (see [`RowProblems`]).
    #[error("{0}")]
    Rows(RowProblems),
    #[error("measuring the chat template's system and generation prompts: {0}")]
    ChatPrompts(crate::tokenizer::TokenizerError),
    #[error("dataset is empty{0}")]
    Empty(String),
    #[error("sampler state: {0}")]
    State(String),
    /// The user's dataset or sampler class failed (its traceback), or its helper did.
    #[error("{what}: {message}")]
    Python { what: String, message: String },
}
