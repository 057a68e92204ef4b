//! Where configs are looked up: the ordered config search path of Hydra. Entries are
//! directories on disk or verlc's built-in default tree (which also answers to verl's
//! `pkg://verl.trainer.config`, so configs that extend verl's tree compose without verl).

use std::path::{Path, PathBuf};

use super::read::{ReadBudget, ReadError};
use super::version::BuiltinRelease;
use crate::source::{Source, SourceKind};

#[derive(Clone, Debug, PartialEq)]
pub enum SearchDir {
    Dir(PathBuf),
    /// The built-in tree of a release.
    Builtin(BuiltinRelease),
}

/// Display prefix of built-in files in diagnostics.
pub const BUILTIN_PREFIX: &str = "<verlc defaults>";

/// The name diagnostics give a built-in file: `<verlc defaults>/actor/actor.yaml` for verlc's
/// own 0.7.0 tree, `<verl 0.9.1>/actor/actor.yaml` for a release's derived one.
pub fn builtin_name(release: BuiltinRelease, rel: &str) -> String {
    if release == BuiltinRelease::V0_7_0 {
        format!("{BUILTIN_PREFIX}/{rel}")
    } else {
        format!("<verl {}>/{rel}", release.version())
    }
}

#[derive(Clone, Debug, Default)]
pub struct Repo {
    pub search_path: Vec<SearchDir>,
}

impl Repo {
    pub fn new(search_path: Vec<SearchDir>) -> Self {
        Repo { search_path }
    }

    pub fn push(&mut self, dir: SearchDir) {
        if !self.search_path.contains(&dir) {
            self.search_path.push(dir);
        }
    }

    /// Interpret a `hydra.searchpath` entry (`pkg://a.b`, `file://dir`, or a bare path);
    /// verl's own tree is the built-in one of `builtin`'s release.
    pub fn search_dir_from_url(
        url: &str,
        cwd: &Path,
        builtin: BuiltinRelease,
    ) -> Result<SearchDir, String> {
        if let Some(pkg) = url.strip_prefix("pkg://") {
            let pkg = pkg.trim_end_matches('/');
            if pkg == "verl.trainer.config" || pkg == "verl/trainer/config" {
                return Ok(SearchDir::Builtin(builtin));
            }
            return Err(format!(
                "cannot search Python package `{pkg}`: verlc only knows verl's own `pkg://verl.trainer.config` (its built-in default tree); use `file://` with a directory instead"
            ));
        }
        if url.starts_with("structured://") {
            return Err(format!(
                "cannot search `{url}`: structured configs live in a Python ConfigStore, which verlc does not run; use `file://` with a directory instead"
            ));
        }
        // Hydra knows `file://`, `pkg://` and `structured://`; a bare path is a file path.
        if let Some((scheme, _)) = url.split_once("://")
            && scheme != "file"
        {
            return Err(format!(
                "unknown search path scheme `{scheme}://` in `{url}`: Hydra's are `file://`, `pkg://` and `structured://`"
            ));
        }
        let path = url.strip_prefix("file://").unwrap_or(url);
        let p = if Path::new(path).is_absolute() {
            PathBuf::from(path)
        } else {
            cwd.join(path)
        };
        // Run outside a verl checkout, `file://verl/trainer/config` means verl's tree: ours.
        if !p.is_dir() && path.trim_end_matches('/').ends_with("verl/trainer/config") {
            return Ok(SearchDir::Builtin(builtin));
        }
        Ok(SearchDir::Dir(p))
    }

    /// Load `group/name` (without `.yaml`) from the first search dir that has it, reading
    /// files within `budget`.
    pub fn load(
        &self,
        config_path: &str,
        budget: &mut ReadBudget,
    ) -> Option<Result<Source, ReadError>> {
        let rel = format!("{config_path}.yaml");
        for dir in &self.search_path {
            match dir {
                SearchDir::Builtin(release) => {
                    if let Some((_, text)) = release.files().iter().find(|(p, _)| *p == rel) {
                        return Some(Ok(Source::new(
                            builtin_name(*release, &rel),
                            *text,
                            SourceKind::Builtin,
                        )));
                    }
                }
                SearchDir::Dir(d) => {
                    let p = d.join(&rel);
                    match budget.read(&p) {
                        Ok(text) => {
                            return Some(Ok(Source::new(
                                p.display().to_string(),
                                text,
                                SourceKind::File,
                            )));
                        }
                        // A directory named `x.yaml` is not a config either (as in Hydra).
                        Err(ReadError::NotFound { .. } | ReadError::IsDirectory { .. }) => {}
                        Err(e) => return Some(Err(e)),
                    }
                }
            }
        }
        None
    }

    pub fn group_exists(&self, group: &str) -> bool {
        if group.is_empty() {
            return true;
        }
        let prefix = format!("{group}/");
        self.search_path.iter().any(|dir| match dir {
            SearchDir::Builtin(release) => {
                release.files().iter().any(|(p, _)| p.starts_with(&prefix))
            }
            SearchDir::Dir(d) => d.join(group).is_dir(),
        })
    }

    /// Options of a group, for "available options" and "did you mean".
    pub fn options(&self, group: &str) -> Vec<String> {
        let prefix = if group.is_empty() {
            String::new()
        } else {
            format!("{group}/")
        };
        let mut out: Vec<String> = Vec::new();
        for dir in &self.search_path {
            match dir {
                SearchDir::Builtin(release) => {
                    for (p, _) in release.files() {
                        if let Some(rest) = p.strip_prefix(&prefix)
                            && let Some(name) = rest.strip_suffix(".yaml")
                            && !name.contains('/')
                        {
                            out.push(name.to_string());
                        }
                    }
                }
                SearchDir::Dir(d) => {
                    if let Ok(rd) = std::fs::read_dir(d.join(group)) {
                        for e in rd.flatten() {
                            let name = e.file_name().to_string_lossy().to_string();
                            if let Some(stem) = name.strip_suffix(".yaml") {
                                out.push(stem.to_string());
                            }
                        }
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// Normalise `a/../b` style group paths.
pub fn normalize_group(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}
