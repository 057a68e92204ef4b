//! Shared by the integration tests that read verl trees the repository carries as fixtures
//! (`tests/fixtures/verl_trees/`, derived from verl's repository by `scripts/builtin_tree.py`:
//! verl's values without its comments) or that `scripts/setup` unpacks from verl's wheels.
// Each test crate uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The commit of verl's main branch whose example scripts tests/fixtures/verl_examples_main
/// holds, and whose config tree tests/fixtures/verl_trees/main is.
pub const VERL_MAIN_REF: &str = "1dda039b9c6311889a9c9a26040677e1254814f9";

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// verl main's config tree at [`VERL_MAIN_REF`] (with its `verl/version/version`).
pub fn verl_main_tree() -> PathBuf {
    workspace().join("tests/fixtures/verl_trees/main/verl/trainer/config")
}

/// A root holding verl 0.7.0's example config dirs at their repository paths
/// (`examples/sglang_multiturn/config`), which extend verl's tree through `hydra.searchpath`.
pub fn verl_0_7_0_examples_root() -> PathBuf {
    workspace().join("tests/fixtures/verl_trees/0.7.0-examples")
}

/// The config tree of verl `release` that `scripts/setup` unpacks from its wheel into
/// `.venv/verl-releases/`, or `None` (recorded as missing data) where it is absent.
pub fn release_tree(release: &str) -> Option<PathBuf> {
    let d = workspace().join(format!(".venv/verl-releases/{release}/verl/trainer/config"));
    if d.is_dir() {
        Some(d)
    } else {
        verlc_testkit::missing_data(format!(
            "no verl {release} tree at {} (scripts/setup unpacks it)",
            d.display()
        ));
        None
    }
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

/// Copies the directory `from` to `to` (`cp -r`; `to` must not exist).
pub fn copy_tree(from: &Path, to: &Path) {
    if let Some(p) = to.parent() {
        std::fs::create_dir_all(p).expect("create dirs");
    }
    let status = std::process::Command::new("cp")
        .arg("-r")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(
        status.success(),
        "cp -r {} {}",
        from.display(),
        to.display()
    );
}
