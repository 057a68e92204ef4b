//! The committed leaf tables of verl releases (`front/releases/verl-*.json`) are what
//! `scripts/release_leaves.py` derives from each release's own files (its generated trees,
//! each trainer composed with every engine, its dataclass annotations). On a difference the
//! test fails with the keys that differ; `VERLC_UPDATE_RELEASES=1 cargo test -p verlc --test
//! release_tables` rewrites the tables instead. A release whose tree scripts/setup did not
//! unpack is skipped (said on stderr).
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

fn leaves(text: &str) -> serde_json::Map<String, serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(text).expect("a table is JSON");
    v["leaves"]
        .as_object()
        .cloned()
        .expect("a table has leaves")
}

/// Whether the committed files are to be rewritten rather than compared.
fn updating() -> bool {
    std::env::var("VERLC_UPDATE_RELEASES").is_ok_and(|v| v == "1")
}

/// The venv's Python and the unpacked package of verl `release` (scripts/setup), if both are
/// there (else said on stderr).
fn python_and_release(release: &str) -> Option<(PathBuf, PathBuf)> {
    let root = workspace();
    let python = root.join(".venv/bin/python");
    let tree = root.join(".venv/verl-releases").join(release);
    if !tree.join("verl/trainer/config").is_dir() || !python.is_file() {
        verlc_testkit::missing_data(format!(
            "no verl {release} tree or no venv (scripts/setup unpacks and creates them)"
        ));
        return None;
    }
    Some((python, tree))
}

/// The venv's Python and its site-packages, which hold verl 0.7.0 (scripts/setup installs it).
fn venv_verl_0_7_0() -> Option<(PathBuf, PathBuf)> {
    let root = workspace();
    let python = root.join(".venv/bin/python");
    let site = std::fs::read_dir(root.join(".venv/lib"))
        .ok()?
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| {
            p.join("verl/trainer/config/sft_trainer_engine.yaml")
                .is_file()
        });
    match site {
        Some(site) if python.is_file() => Some((python, site)),
        _ => {
            verlc_testkit::missing_data("no venv with verl 0.7.0 (scripts/setup installs it)");
            None
        }
    }
}

/// Every release verlc carries besides the 0.7.0 it models: each has its leaf table
/// (`front/releases/verl-<release>.json`) and built-in tree (`front/releases/verl-<release>/`).
const CARRIED: &[&str] = &["0.7.1", "0.8.0", "0.9.0", "0.9.1"];

#[test]
fn committed_release_tables_are_fresh() {
    let mut jobs: Vec<(String, &str)> = CARRIED.iter().map(|r| (r.to_string(), "json")).collect();
    // verl's SFT trainer's tables: every carried release's, and 0.7.0's (the venv's verl).
    jobs.extend(CARRIED.iter().map(|r| (r.to_string(), "sft.json")));
    jobs.push(("0.7.0".into(), "sft.json"));
    // 0.7.0's legacy `fsdp_sft_trainer` (config `sft_trainer`).
    jobs.push(("0.7.0".into(), "legacy_sft.json"));
    tables_are_fresh(&jobs);
}

fn tables_are_fresh(jobs: &[(String, &str)]) {
    let root = workspace();
    let update = updating();
    let mut checked = 0;
    for (release, ext) in jobs {
        let release = release.as_str();
        let found = if release == "0.7.0" {
            venv_verl_0_7_0()
        } else {
            python_and_release(release)
        };
        let Some((python, tree)) = found else {
            continue;
        };
        let committed = root.join(format!("front/releases/verl-{release}.{ext}"));
        let scratch = tempfile::tempdir().expect("tempdir");
        let fresh = scratch.path().join("table.json");
        let mut cmd = std::process::Command::new(&python);
        cmd.arg(root.join("scripts/release_leaves.py"))
            .arg(&tree)
            .arg(release)
            .arg(&fresh);
        match *ext {
            "sft.json" => {
                cmd.arg("--sft");
            }
            "legacy_sft.json" => {
                cmd.arg("--legacy-sft");
            }
            _ => {}
        }
        let status = cmd.status().expect("run scripts/release_leaves.py");
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
                "front/releases/verl-{release}.{ext} is stale (keys that differ: {differ:?}); \
                 rerun with VERLC_UPDATE_RELEASES=1"
            );
        }
        checked += 1;
    }
    eprintln!("{checked} release table(s) fresh");
}

/// The text of every file under `dir`, by path relative to it.
fn files_under(dir: &Path) -> std::collections::BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
                out.insert(rel, std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The built-in trees of the carried releases (`front/releases/verl-<release>/`, composed
/// with `--verl-version`; 0.9.1's is the default without `--config-dir`) are what
/// `scripts/builtin_tree.py` derives from each release's own files; `VERLC_UPDATE_RELEASES=1`
/// rewrites them.
#[test]
fn committed_builtin_release_trees_are_fresh() {
    let root = workspace();
    let update = updating();
    for &release in CARRIED {
        let Some((python, tree)) = python_and_release(release) else {
            continue;
        };
        let committed = root.join(format!("front/releases/verl-{release}"));
        let scratch = tempfile::tempdir().expect("tempdir");
        let fresh = scratch.path().join("tree");
        let target = if update { &committed } else { &fresh };
        let status = std::process::Command::new(&python)
            .arg(root.join("scripts/builtin_tree.py"))
            .arg(&tree)
            .arg(release)
            .arg(target)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run scripts/builtin_tree.py");
        assert!(status.success(), "builtin_tree.py failed for {release}");
        if update {
            continue;
        }
        let (want, have) = (files_under(&fresh), files_under(&committed));
        let differ: Vec<&String> = want
            .keys()
            .chain(have.keys())
            .filter(|k| want.get(*k) != have.get(*k))
            .collect();
        assert!(
            differ.is_empty(),
            "front/releases/verl-{release}/ is stale (files that differ: {differ:?}); rerun with VERLC_UPDATE_RELEASES=1"
        );
    }
}

/// Releases whose trees differ are told apart: every release `scripts/setup` unpacks is
/// carried (its own built-in tree and leaf table, not a neighbour's), and where two carried
/// releases' trees differ, their tables differ too. (verl 0.9.0 was once judged with 0.9.1's
/// table: 0.9.1 had dropped keys 0.9.0's own examples set.)
#[test]
fn releases_whose_trees_differ_have_tables_that_differ() {
    use verlc_front::load::release_table::for_release;
    use verlc_front::load::version::BuiltinRelease;
    let root = workspace();
    let unpacked: Vec<String> = std::fs::read_dir(root.join(".venv/verl-releases"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if unpacked.is_empty() {
        verlc_testkit::missing_data("no verl release trees in .venv/verl-releases (scripts/setup)");
        return;
    }
    for release in &unpacked {
        assert!(
            CARRIED.contains(&release.as_str()),
            "scripts/setup unpacks verl {release}, which verlc does not carry (add its table and tree)"
        );
    }
    for &release in CARRIED {
        let table = for_release(release).unwrap_or_else(|| panic!("no table for {release}"));
        assert_eq!(
            table.release, release,
            "verl {release} is read with another's table"
        );
        let builtin = BuiltinRelease::parse(release).expect("a built-in tree");
        assert_eq!(builtin.version(), release);
    }
    for pair in CARRIED.windows(2) {
        let pair: [&str; 2] = [pair[0], pair[1]];
        let trees = pair.map(|r| files_under(&root.join(format!("front/releases/verl-{r}"))));
        let strip = |m: &std::collections::BTreeMap<String, String>| -> Vec<(String, String)> {
            // The header line names the release; the rest is the tree.
            m.iter()
                .map(|(k, v)| (k.clone(), v.lines().skip(1).collect::<Vec<_>>().join("\n")))
                .collect()
        };
        if strip(&trees[0]) != strip(&trees[1]) {
            let tables = pair.map(|r| {
                std::fs::read_to_string(root.join(format!("front/releases/verl-{r}.json")))
                    .expect("table")
            });
            assert_ne!(
                leaves(&tables[0]),
                leaves(&tables[1]),
                "verl {} and {} have different trees but the same leaf table",
                pair[0],
                pair[1]
            );
        }
    }
}
