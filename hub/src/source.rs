//! What a model path in a config names: a built-in model, a local directory, or a Hub id, in
//! the order transformers' `from_pretrained` tries them (an existing directory wins over an id
//! of the same spelling).

use std::path::{Path, PathBuf};

use crate::{HubEnv, HubError, RepoId, Snapshot, find_snapshot};

/// Where a model path leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelLocation {
    /// `builtin://...`: no files.
    Builtin,
    /// An existing directory, or a path that is not a Hub id (reading it reports what is
    /// missing).
    Local(PathBuf),
    /// A Hub id found in the cache.
    Hub(Snapshot),
}

impl ModelLocation {
    /// The directory holding `config.json` and the weights (`None` for built-in models).
    pub fn dir(&self) -> Option<&Path> {
        match self {
            ModelLocation::Builtin => None,
            ModelLocation::Local(p) => Some(p),
            ModelLocation::Hub(s) => Some(&s.dir),
        }
    }
}

/// Whether `path` can only be meant as a Hub id: it is not an existing path, has no leading
/// `/`, `.` or `~` and is a valid id.
pub fn hub_id(path: &str) -> Option<RepoId> {
    if path.starts_with(['/', '.', '~']) || Path::new(path).exists() {
        return None;
    }
    RepoId::parse(path).ok()
}

/// Where `path` (a config's `model.path` or `tokenizer_path`) leads, at `revision`, looking
/// Hub ids up in `env`'s cache.
pub fn locate(path: &str, revision: Option<&str>, env: &HubEnv) -> Result<ModelLocation, HubError> {
    if path.starts_with("builtin://") {
        return Ok(ModelLocation::Builtin);
    }
    match hub_id(path) {
        Some(id) => Ok(ModelLocation::Hub(find_snapshot(env, &id, revision)?)),
        None => Ok(ModelLocation::Local(PathBuf::from(path))),
    }
}
