//! Collectives over torch's c10d engine: TCPStore rendezvous, ProcessGroupGloo (CPU) and
//! ProcessGroupNCCL (CUDA, `cuda` feature), reached through the C++ shim.
//!
//! Process groups are values: [`ProcessGroup::init`] builds the world group from torchrun's
//! environment ([`DistEnv`]), [`ProcessGroup::new_group`] / [`ProcessGroup::split`] carve
//! sub-groups out of it ([`super::layout::ProcessGroups`] bundles the groups of a rank's
//! layout).
//! Nothing is global. Every collective is bounded by the group's timeout, so a dead or stuck
//! peer surfaces as [`DistError::Collective`] instead of a hang.
mod env;
mod group;
mod launch;
mod store;

pub use env::DistEnv;
pub use group::{Backend, GlooDevice, GlooPacing, InitOptions, ProcessGroup, ReduceOp};
pub use launch::{LaunchedRanks, LocalLauncher, free_port, rank_env};
pub use store::Store;

use std::time::Duration;

/// torch.distributed's default collective timeout (`default_pg_timeout`, 30 minutes).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("environment variable {var} is not set (needed with {needed_by})")]
    MissingEnv {
        var: &'static str,
        needed_by: &'static str,
    },
    #[error("environment variable {var}={value:?} is invalid: {reason}")]
    BadEnv {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("rendezvous store: {op}: {message}")]
    Store { op: &'static str, message: String },
    #[error("creating the {backend} process group (rank {rank} of {size}): {message}")]
    Init {
        backend: Backend,
        rank: usize,
        size: usize,
        message: String,
    },
    #[error("{op} on process group {group}: {message}")]
    Collective {
        op: &'static str,
        group: String,
        message: String,
    },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("launching rank {rank}: {source}")]
    Launch { rank: usize, source: std::io::Error },
    #[error("rank {rank} failed: {status}")]
    RankFailed { rank: usize, status: String },
}

pub type Result<T, E = DistError> = std::result::Result<T, E>;
