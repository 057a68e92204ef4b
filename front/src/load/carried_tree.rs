//! A verl config tree carried whole: a trainer built from `--config-dir` embeds the tree it
//! was judged against, so its run-time overrides are composed and judged against that same
//! tree (a release verlc has no built-in tree of, or a tree the user changed), not against
//! verlc's newest built-in one.
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The most YAML a carried tree may hold (verl's is about 200 KiB).
const MAX_TREE_BYTES: u64 = 16 << 20;

/// A config directory's YAML files and its release.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarriedTree {
    /// The release its `verl/version/version` names (`None`: the tree has no version file;
    /// then its layout tells, as for the directory itself).
    pub version: Option<String>,
    /// Path relative to the config directory (`/`-separated) -> text, every `.yaml` file.
    pub files: BTreeMap<String, String>,
}

impl CarriedTree {
    /// Every `.yaml` file under `dir` (symbolic links followed, as composition follows them).
    pub fn read(dir: &Path) -> Result<Self, String> {
        let mut tree = CarriedTree {
            version: super::version::verl_version(dir),
            files: BTreeMap::new(),
        };
        let mut total = 0u64;
        let mut pending = vec![PathBuf::new()];
        while let Some(rel) = pending.pop() {
            let here = dir.join(&rel);
            let entries =
                std::fs::read_dir(&here).map_err(|e| format!("{}: {e}", here.display()))?;
            for entry in entries {
                let entry = entry.map_err(|e| format!("{}: {e}", here.display()))?;
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                let path = entry.path();
                let sub = rel.join(name);
                if path.is_dir() {
                    pending.push(sub);
                } else if name.ends_with(".yaml") && path.is_file() {
                    let text = super::read::read_text(&path, MAX_TREE_BYTES - total)
                        .map_err(|e| e.to_string())?;
                    total += text.len() as u64;
                    let key: Vec<&str> = sub.iter().filter_map(|c| c.to_str()).collect();
                    tree.files.insert(key.join("/"), text);
                }
            }
        }
        Ok(tree)
    }

    /// Writes the tree as `<root>/verl/trainer/config` (with `verl/version/version` when it
    /// has a release), where verl keeps it, and returns that config directory. Safe to call
    /// from several processes at once: each file is written aside and renamed into place.
    pub fn materialize(&self, root: &Path) -> Result<PathBuf, String> {
        let verl = root.join("verl");
        let config = verl.join("trainer").join("config");
        for (rel, text) in &self.files {
            let rel = Path::new(rel);
            if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
                return Err(format!("`{}` is not a path inside the tree", rel.display()));
            }
            write_in_place(&config.join(rel), text)?;
        }
        if let Some(v) = &self.version {
            write_in_place(&verl.join("version").join("version"), v)?;
        }
        Ok(config)
    }
}

/// Writes `text` to `path` through a file of its own beside it, renamed into place.
fn write_in_place(path: &Path, text: &str) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let aside = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&aside, text).map_err(|e| format!("{}: {e}", aside.display()))?;
    std::fs::rename(&aside, path).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_read_and_written_back_reads_the_same() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("verl/trainer/config");
        std::fs::create_dir_all(config.join("actor")).expect("dirs");
        std::fs::create_dir_all(dir.path().join("verl/version")).expect("dirs");
        std::fs::write(
            config.join("ppo_trainer.yaml"),
            "defaults:\n  - actor@actor: dp\n",
        )
        .expect("write");
        std::fs::write(config.join("actor/dp.yaml"), "strategy: fsdp\n").expect("write");
        std::fs::write(config.join("notes.txt"), "not yaml").expect("write");
        std::fs::write(dir.path().join("verl/version/version"), "0.8.0\n").expect("write");
        let tree = CarriedTree::read(&config).expect("read");
        assert_eq!(tree.version.as_deref(), Some("0.8.0"));
        assert_eq!(
            tree.files.keys().collect::<Vec<_>>(),
            ["actor/dp.yaml", "ppo_trainer.yaml"]
        );
        let out = tempfile::tempdir().expect("temp dir");
        let again = tree.materialize(out.path()).expect("materialize");
        assert_eq!(CarriedTree::read(&again).expect("read back"), tree);
        // Twice over the same place (ranks of one job): the same files.
        tree.materialize(out.path()).expect("again");
        assert_eq!(CarriedTree::read(&again).expect("read back"), tree);
        let bad = CarriedTree {
            version: None,
            files: BTreeMap::from([("../escape.yaml".to_owned(), String::new())]),
        };
        assert!(bad.materialize(out.path()).is_err());
    }
}
