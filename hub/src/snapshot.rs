//! A repository's snapshot in the cache: `refs/<revision>` names a commit, whose files are in
//! `snapshots/<commit>/`. A revision that is itself a 40-digit commit hash names its snapshot
//! directly.

use std::path::PathBuf;

use crate::{HubEnv, HubError, RepoId};

/// A model's files for one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub id: RepoId,
    pub commit: String,
    /// `<cache>/models--*/snapshots/<commit>`.
    pub dir: PathBuf,
}

fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The cached snapshot of `id` at `revision` (`main` when `None`) holding a `config.json`.
pub fn find_snapshot(
    env: &HubEnv,
    id: &RepoId,
    revision: Option<&str>,
) -> Result<Snapshot, HubError> {
    let revision = revision.unwrap_or("main");
    let repo = env.cache.join(id.cache_folder());
    let not_cached = || HubError::NotCached {
        id: id.to_string(),
        revision: revision.to_owned(),
        cache: env.cache.clone(),
        offline: env.offline,
    };
    let commit = if is_commit(revision) {
        revision.to_owned()
    } else {
        // Branch and tag names may contain `/` (`refs/pr/1`): one file per name under refs/.
        let file = repo.join("refs").join(revision);
        match std::fs::read_to_string(&file) {
            Ok(text) => text.trim().to_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_cached()),
            Err(source) => return Err(HubError::Io { path: file, source }),
        }
    };
    if !is_commit(&commit) {
        return Err(HubError::Incomplete {
            id: id.to_string(),
            path: repo.join("refs").join(revision),
            missing: format!("commit hash (it reads `{commit}`)"),
        });
    }
    let dir = repo.join("snapshots").join(&commit);
    if !dir.is_dir() {
        return Err(not_cached());
    }
    if !dir.join("config.json").is_file() {
        return Err(HubError::Incomplete {
            id: id.to_string(),
            path: dir,
            missing: "config.json".into(),
        });
    }
    Ok(Snapshot {
        id: id.clone(),
        commit,
        dir,
    })
}
