//! Models named by their Hugging Face Hub id (`Qwen/Qwen2.5-0.5B-Instruct`), found where
//! `huggingface_hub` and transformers keep them: the Hub cache, one folder per repository
//! (`models--Qwen--Qwen2.5-0.5B-Instruct`) holding `refs/<revision>` (a commit hash) and
//! `snapshots/<commit>/` (the repository's files, symlinks into `blobs/`).
//!
//! This crate only reads the cache (the compiler's checks and the trainers' loaders use it, and
//! neither touches the network); `verlc fetch`, `verlc build` and `verlc run` fill it through a
//! Hub client. [`HubEnv`] reads the same environment variables as `huggingface_hub`.

mod env;
mod repo_id;
mod snapshot;
mod source;

pub use env::HubEnv;
pub use repo_id::RepoId;
pub use snapshot::{Snapshot, find_snapshot};
pub use source::{ModelLocation, hub_id, locate};

use std::path::PathBuf;

/// Why a model could not be found.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("`{id}` is not a Hugging Face Hub model id: {reason}")]
    BadId { id: String, reason: String },
    #[error(
        "`{id}` (revision `{revision}`) is not in the Hugging Face Hub cache at {}{}",
        cache.display(),
        if *offline { " and HF_HUB_OFFLINE is set, so it cannot be downloaded" } else { "; `verlc fetch` downloads it (`verlc build` and `verlc run` do it for you)" }
    )]
    NotCached {
        id: String,
        revision: String,
        cache: PathBuf,
        offline: bool,
    },
    #[error("the Hub cache's snapshot of `{id}` at {} has no {missing}", path.display())]
    Incomplete {
        id: String,
        path: PathBuf,
        missing: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}
