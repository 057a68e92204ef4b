//! The repository's layout holds: the front end's and the runtime's top-level modules import
//! only modules below them in their declared layers (so no cycle either), the trainer's
//! runtime links none of the command line's crates, and no file names a path outside the
//! repository, and each crate is named after its directory. docs/architecture.md describes the
//! layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The front end's top-level modules, lowest first: each may use only those before it.
const FRONT_LAYERS: &[&str] = &[
    "source", "diag", "codes", "redact", "config", "load", "role", "reward", "veomni", "rules",
    "plan", "explain", "sft", "schema", "check", "compile", "render", "migrate",
];

/// The runtime's, lowest first.
const RUNTIME_LAYERS: &[&str] = &[
    "ffi",
    "ops",
    "rng",
    "host_alloc",
    "process_exit",
    "pyproc",
    "tokenizer",
    "model",
    "algo",
    "logits",
    "parallel",
    "optim",
    "engine",
    "data",
    "rollout",
    "logging",
    "workers",
    "trainer",
    "sft",
    "binding",
];

/// Source text without comments and without the unit tests at the end of a file (tests may
/// reach any module).
fn production_text(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `text` names through `crate::` (plain paths and `crate::{..}`
/// groups).
fn crate_references(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // Top-level names of the group: after `{` or a `,` at depth 0.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        out.insert(ident(&group[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(after));
        }
        rest = after;
    }
    out.retain(|s| !s.is_empty());
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every import of a top-level module by another that is not below it, as
/// `file: from -> to`.
fn layer_violations(src: &Path, layers: &[&str]) -> Vec<String> {
    let rank: BTreeMap<&str, usize> = layers.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        let name = file.file_name().unwrap().to_string_lossy();
        if top == "lib" || top == "main" || name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        seen.insert(top.clone());
        let Some(&from) = rank.get(top.as_str()) else {
            problems.push(format!(
                "{}: module `{top}` is in no layer of this test",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for to in crate_references(&production_text(&text)) {
            if to == top {
                continue;
            }
            match rank.get(to.as_str()) {
                Some(&r) if r > from => {
                    problems.push(format!("{}: `{top}` uses `{to}` above it", rel.display()))
                }
                _ => {}
            }
        }
    }
    for m in layers {
        if !seen.contains(*m) {
            problems.push(format!("layer `{m}` names no module of {}", src.display()));
        }
    }
    problems
}

#[test]
fn front_end_modules_import_only_lower_layers() {
    let problems = layer_violations(&checkout().join("front/src"), FRONT_LAYERS);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn runtime_modules_import_only_lower_layers() {
    let problems = layer_violations(&checkout().join("runtime/src"), RUNTIME_LAYERS);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Only the safe wrappers call the C++ shim: the kernels' (`ops.rs`) and the collectives'
/// (`parallel/dist/`). Everything else goes through them.
#[test]
fn only_the_safe_wrappers_call_the_shim() {
    let src = checkout().join("runtime/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut callers: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            crate_references(&production_text(&text)).contains("ffi")
        })
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    callers.retain(|f| f != "ops.rs" && !f.starts_with("parallel/dist/"));
    assert!(
        callers.is_empty(),
        "modules calling the shim directly: {callers:?}"
    );
}

#[test]
fn the_reference_scanner_sees_paths_and_groups() {
    let refs =
        crate_references("use crate::a::b;\nuse crate::{c::{d, e}, f};\nlet x = crate::g::h();");
    let want: BTreeSet<String> = ["a", "c", "f", "g"].map(String::from).into();
    assert_eq!(refs, want);
    let text = production_text(
        "use crate::a; // crate::b\n#[cfg(test)]\nmod tests {\n use crate::c;\n}\n",
    );
    assert_eq!(crate_references(&text), ["a".to_owned()].into());
}

/// The trainer links the runtime: none of the command line's crates (argument parsing,
/// schema validation, the Hub client and its TLS stack, progress bars) may come with it.
#[test]
fn the_runtime_links_no_command_line_crates() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(checkout())
        .args([
            "tree",
            "-p",
            "verlc-runtime",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let names: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(names.contains("tch"), "not the runtime's tree:\n{tree}");
    let linked: Vec<&str> = [
        "clap",
        "jsonschema",
        "hf-hub",
        "rustls",
        "indicatif",
        "ureq",
    ]
    .into_iter()
    .filter(|c| names.contains(c))
    .collect();
    assert!(linked.is_empty(), "the runtime links {linked:?}");
}

/// What git tracks never points outside the checkout: no `../shared`, no development
/// machine's absolute paths.
#[test]
fn no_file_names_a_path_outside_the_repository() {
    let root = checkout();
    let out = Command::new("git")
        .current_dir(&root)
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files");
    if !out.status.success() {
        // Not a git checkout (an unpacked source archive): nothing to list.
        return;
    }
    // (verl's own example overrides name /root/data on purpose: data of those scripts.)
    let needles = [
        "../shared",
        "shared/reference",
        "shared/DESIGN",
        "/work/",
        "/tmp/ci-",
    ];
    let mut found = Vec::new();
    for name in String::from_utf8_lossy(&out.stdout).split('\0') {
        if name.is_empty() || name == "cli/tests/layout.rs" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(name)) else {
            continue; // binary or removed
        };
        for (i, line) in text.lines().enumerate() {
            if let Some(n) = needles.iter().find(|n| line.contains(**n)) {
                found.push(format!("{name}:{}: `{n}`", i + 1));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}

/// The `name = "..."` of a `[section]` in a Cargo manifest (the workspace's manifests are
/// simple enough to read line by line).
fn manifest_name(manifest: &str, section: &str) -> Option<String> {
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == section;
        } else if inside && let Some(v) = line.strip_prefix("name = ") {
            return Some(v.trim_matches('"').to_owned());
        }
    }
    None
}

/// A crate's directory names it: directory `X` holds package `verlc-X` and library
/// `verlc_X`; the command line (`cli/`) is the package `verlc`.
#[test]
fn each_crate_is_named_after_its_directory() {
    let root = checkout();
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let members = workspace
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = ["))
        .expect("a one-line members list");
    let members: Vec<&str> = members
        .trim_end_matches(']')
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .collect();
    assert!(members.len() >= 7, "{members:?}");
    let mut wrong = Vec::new();
    for dir in members {
        assert!(
            !dir.contains('/'),
            "member {dir} is not a top-level directory"
        );
        let manifest = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).expect(dir);
        let package = manifest_name(&manifest, "[package]");
        let want = if dir == "cli" {
            "verlc".to_owned()
        } else {
            format!("verlc-{dir}")
        };
        if package.as_deref() != Some(want.as_str()) {
            wrong.push(format!("{dir}/: package {package:?}, want {want}"));
        }
        if let Some(lib) = manifest_name(&manifest, "[lib]") {
            let want = format!("verlc_{dir}");
            if lib != want {
                wrong.push(format!("{dir}/: library {lib}, want {want}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
