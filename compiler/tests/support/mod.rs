//! Shared by the integration tests that read verl's own files from a verl git mirror
//! (`VERL_REPO`, default [`DEFAULT_MIRROR`]); CI has no mirror and those cases skip.
// Each test crate uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const DEFAULT_MIRROR: &str = "/work/.mirror/volcengine+verl/repo";

/// The commit of verl's main branch whose example scripts tests/fixtures/verl_examples_main
/// holds.
pub const VERL_MAIN_REF: &str = "b178a3cd56f58b2d502255daba591e92833930a7";

/// A verl git repository (no work tree needed).
pub struct Mirror {
    pub repo: String,
}

impl Mirror {
    pub fn from_env() -> Mirror {
        Mirror {
            repo: std::env::var("VERL_REPO").unwrap_or_else(|_| DEFAULT_MIRROR.to_string()),
        }
    }

    /// `git -C <repo> <args>`, if it succeeded.
    pub fn git(&self, args: &[&str]) -> Option<Output> {
        Command::new("git")
            .arg("-C")
            .arg(&self.repo)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
    }

    /// Writes the YAML files under `dir` at `git_ref`, and the `extra` files, below `root` at
    /// their repository paths. `None` when the mirror lacks `dir` at that ref.
    pub fn materialize(&self, git_ref: &str, dir: &str, extra: &[&str], root: &Path) -> Option<()> {
        let files = self.git(&["ls-tree", "-r", "--name-only", git_ref, dir])?;
        let files = String::from_utf8_lossy(&files.stdout).to_string();
        for f in files
            .lines()
            .filter(|f| f.ends_with(".yaml"))
            .chain(extra.iter().copied())
        {
            let text = self.git(&["show", &format!("{git_ref}:{f}")])?.stdout;
            write(&root.join(f), &String::from_utf8_lossy(&text));
        }
        Some(())
    }
}

/// verl main's config tree and its version file at [`VERL_MAIN_REF`], below `root`; the
/// config dir, or `None` without a mirror that has that commit.
pub fn verl_main_tree(root: &Path) -> Option<PathBuf> {
    let tree = "verl/trainer/config";
    Mirror::from_env().materialize(VERL_MAIN_REF, tree, &["verl/version/version"], root)?;
    Some(root.join(tree))
}

/// Write through a temporary file and a rename, so a concurrent run never reads half a file.
pub fn write(path: &Path, text: &str) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).expect("create dirs");
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).expect("write file");
    std::fs::rename(&tmp, path).expect("rename file");
}
