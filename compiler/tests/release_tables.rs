//! The committed leaf tables of verl releases (`compiler/releases/verl-*.json`) are what
//! `scripts/release_leaves.py` derives from each release's own files (its generated trees,
//! each trainer composed with every engine, its dataclass annotations). On a difference the
//! test fails with the keys that differ; `VERLC_UPDATE_RELEASES=1 cargo test -p verlc --test
//! release_tables` rewrites the tables instead. A release whose tree scripts/setup did not
//! unpack is skipped (said on stderr).
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).to_path_buf()
}

fn leaves(text: &str) -> serde_json::Map<String, serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(text).expect("a table is JSON");
    v["leaves"]
        .as_object()
        .cloned()
        .expect("a table has leaves")
}

#[test]
fn committed_release_tables_are_fresh() {
    let root = workspace();
    let python = root.join(".venv/bin/python");
    let update = std::env::var("VERLC_UPDATE_RELEASES").is_ok_and(|v| v == "1");
    let mut checked = 0;
    for release in ["0.8.0", "0.9.1"] {
        let tree = root.join(".venv/verl-releases").join(release);
        if !tree.join("verl/trainer/config").is_dir() || !python.is_file() {
            eprintln!("skipped verl {release}: no tree or venv (run scripts/setup)");
            continue;
        }
        let committed = root.join(format!("compiler/releases/verl-{release}.json"));
        let scratch = tempfile::tempdir().expect("tempdir");
        let fresh = scratch.path().join("table.json");
        let status = std::process::Command::new(&python)
            .arg(root.join("scripts/release_leaves.py"))
            .arg(&tree)
            .arg(release)
            .arg(&fresh)
            .status()
            .expect("run scripts/release_leaves.py");
        assert!(status.success(), "release_leaves.py failed for {release}");
        let (want, have) = (
            std::fs::read_to_string(&fresh).expect("fresh table"),
            std::fs::read_to_string(&committed).unwrap_or_default(),
        );
        if want != have {
            if update {
                std::fs::write(&committed, &want).expect("rewrite the table");
                continue;
            }
            let (w, h) = (leaves(&want), leaves(&have));
            let differ: Vec<&String> = w
                .keys()
                .chain(h.keys())
                .filter(|k| w.get(*k) != h.get(*k))
                .take(20)
                .collect();
            panic!(
                "compiler/releases/verl-{release}.json is stale (keys that differ: {differ:?}); \
                 rerun with VERLC_UPDATE_RELEASES=1"
            );
        }
        checked += 1;
    }
    eprintln!("{checked} release table(s) fresh");
}
