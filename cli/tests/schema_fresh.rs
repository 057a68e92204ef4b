//! `schemas/` must be exactly what this verlc generates (like ruff's generated-file checks).
//! On a difference the test fails with a summary; `VERLC_UPDATE_SCHEMAS=1 cargo test -p
//! verlc --test schema_fresh` rewrites the files instead (as does `verlc schema -o schemas`).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn schemas_dir() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("schemas")
}

/// A short, readable account of how `old` differs from `new`: the changed line ranges,
/// each with up to a few lines of both sides.
fn diff_summary(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (old_mid, new_mid) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let mut out = format!(
        "    first difference at line {}: {} line(s) committed -> {} line(s) generated\n",
        prefix + 1,
        old_mid.len(),
        new_mid.len()
    );
    const SHOW: usize = 6;
    for l in old_mid.iter().take(SHOW) {
        let _ = writeln!(out, "    - {l}");
    }
    if old_mid.len() > SHOW {
        let _ = writeln!(out, "    - … {} more", old_mid.len() - SHOW);
    }
    for l in new_mid.iter().take(SHOW) {
        let _ = writeln!(out, "    + {l}");
    }
    if new_mid.len() > SHOW {
        let _ = writeln!(out, "    + … {} more", new_mid.len() - SHOW);
    }
    out
}

#[test]
fn committed_schemas_are_fresh() {
    let dir = schemas_dir();
    let update = std::env::var("VERLC_UPDATE_SCHEMAS").is_ok_and(|v| v == "1");
    let generated = verlc_front::schema::all_files();
    let expected: BTreeSet<String> = generated.iter().map(|(n, _)| n.clone()).collect();

    let mut problems = String::new();
    for (name, content) in &generated {
        let path = dir.join(name);
        let committed = std::fs::read_to_string(&path).ok();
        if committed.as_deref() == Some(content.as_str()) {
            continue;
        }
        if update {
            std::fs::create_dir_all(&dir).expect("create schemas/");
            std::fs::write(&path, content).expect("write schema");
            eprintln!("updated {}", path.display());
            continue;
        }
        match committed {
            None => {
                let _ = writeln!(problems, "  {name}: missing");
            }
            Some(old) => {
                let _ = writeln!(problems, "  {name}: stale");
                problems.push_str(&diff_summary(&old, content));
            }
        }
    }
    // Files verlc no longer generates.
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".schema.json") && !expected.contains(&name) {
                if update {
                    let _ = std::fs::remove_file(e.path());
                    eprintln!("removed {}", e.path().display());
                } else {
                    let _ = writeln!(problems, "  {name}: no longer generated");
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "schemas/ is out of date with the config model:\n{problems}\nregenerate with `VERLC_UPDATE_SCHEMAS=1 cargo test -p verlc --test schema_fresh` (or `verlc schema -o schemas`) and commit the result"
    );
}

/// `front/defaults/composed.json` (the built-in trees release builds copy instead of
/// composing, see `src/load/snapshot.rs`) must be what the built-in files compose to.
#[test]
fn committed_default_trees_are_fresh() {
    let path =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("front/defaults/composed.json");
    let generated = verlc_front::load::compose::builtin_trees_text();
    let committed = std::fs::read_to_string(&path).ok();
    if committed.as_deref() == Some(generated.as_str()) {
        return;
    }
    if std::env::var("VERLC_UPDATE_SCHEMAS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("write composed.json");
        eprintln!("updated {}", path.display());
        return;
    }
    panic!(
        "front/defaults/composed.json is {} the built-in files:\n{}\nregenerate with `VERLC_UPDATE_SCHEMAS=1 cargo test -p verlc --test schema_fresh` and commit the result",
        if committed.is_some() {
            "out of date with"
        } else {
            "missing; compose"
        },
        committed
            .map(|old| diff_summary(&old, &generated))
            .unwrap_or_default()
    );
}
