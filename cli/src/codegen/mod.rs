//! `verlc build`: render the trainer crate from `templates/` ([`render`]), write it under the
//! cache directory, and build it with cargo ([`cargo`]) into one target directory shared by
//! every generated crate, so the runtime and tch compile once and a new config costs one small
//! crate and a link.
//!
//! Layout of the cache (`$VERLC_CACHE_DIR`, else `$XDG_CACHE_HOME/verlc`, else
//! `~/.cache/verlc`):
//! - `crates/<package>/`: one generated crate per config (`Cargo.toml`, `build.rs`,
//!   `src/main.rs`, `trainer.yaml`, a `Cargo.lock` seeded from the checkout's);
//! - `target/`: the shared target directory of an installed verlc (`$VERLC_TARGET_DIR`
//!   overrides it); run from a checkout, trainers build into the workspace's `target/`.
//!
//! The crate depends by path on the `runtime` and `macros` crates of the verlc checkout this
//! binary was built from (`$VERLC_SOURCE_DIR` overrides it). Only cargo is run here; nothing in
//! this module needs libtorch.

pub mod cargo;
pub mod render;

use std::path::{Path, PathBuf};
use std::process::Command;

pub use cargo::{CargoFailure, Event};
pub use render::{CrateSpec, Rendered, render_crate};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot render template {name}: {source}")]
    Template {
        name: &'static str,
        source: minijinja::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("verlc's runtime and macros crates are not at {}; set VERLC_SOURCE_DIR to a verlc checkout", .0.display())]
    NoCheckout(PathBuf),
    #[error("cargo failed to build the trainer")]
    Cargo(CargoFailure),
    #[error("cannot serialize the trainer spec: {0}")]
    Spec(serde_json::Error),
    #[error("cargo finished without producing the trainer binary")]
    NoBinary,
}

/// cargo's profile for the trainer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// The verlc workspace's dev profile (shares its compiled runtime; fast to build).
    Dev,
    /// Optimized.
    Release,
}

/// Where things go.
#[derive(Clone, Debug)]
pub struct Paths {
    /// The verlc checkout holding `runtime/` and `macros/`.
    pub checkout: PathBuf,
    /// Generated crates live in `<cache>/crates`.
    pub cache: PathBuf,
    /// The shared cargo target directory.
    pub target: PathBuf,
}

impl Paths {
    /// Defaults from the environment (see the module docs); flags override them.
    pub fn from_env(cache: Option<PathBuf>, target: Option<PathBuf>) -> Paths {
        let checkout = std::env::var_os("VERLC_SOURCE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                // This crate is `cli/` of the checkout.
                let cli = Path::new(env!("CARGO_MANIFEST_DIR"));
                cli.parent().unwrap_or(cli).to_path_buf()
            });
        let cache = cache
            .or_else(|| std::env::var_os("VERLC_CACHE_DIR").map(PathBuf::from))
            .unwrap_or_else(default_cache);
        // In a verlc checkout the trainers build into the workspace's own target directory, so
        // they reuse what building verlc compiled (README command 1 compiles each shared crate
        // once); an installed verlc uses the cache.
        let workspace_target = || {
            checkout.join("Cargo.toml").is_file().then(|| {
                std::env::var_os("CARGO_TARGET_DIR")
                    .map_or_else(|| checkout.join("target"), PathBuf::from)
            })
        };
        let target = target
            .or_else(|| std::env::var_os("VERLC_TARGET_DIR").map(PathBuf::from))
            .or_else(workspace_target)
            .unwrap_or_else(|| cache.join("target"));
        Paths {
            checkout,
            cache,
            target,
        }
    }
}

fn default_cache() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("verlc");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/verlc"),
        None => std::env::temp_dir().join("verlc-cache"),
    }
}

/// A generated crate on disk.
#[derive(Clone, Debug)]
pub struct WrittenCrate {
    pub dir: PathBuf,
    pub rendered: Rendered,
}

/// Render and write the crate for `spec` (`runtime_dir`/`macros_dir` are filled in from
/// `paths`). Unchanged files are not rewritten, so cargo sees a rebuild of the same config as
/// fresh.
pub fn write_crate(spec: CrateSpec, paths: &Paths) -> Result<WrittenCrate, BuildError> {
    let runtime = paths.checkout.join("runtime");
    let macros = paths.checkout.join("macros");
    if !runtime.join("Cargo.toml").is_file() || !macros.join("Cargo.toml").is_file() {
        return Err(BuildError::NoCheckout(paths.checkout.clone()));
    }
    let spec = CrateSpec {
        runtime_dir: runtime.display().to_string(),
        macros_dir: macros.display().to_string(),
        ..spec
    };
    let rendered = render_crate(&spec)?;
    let dir = paths.cache.join("crates").join(&rendered.package);
    for (rel, text) in &rendered.files {
        let text = if rel.ends_with(".rs") {
            rustfmt(text)
        } else {
            text.clone()
        };
        write_if_changed(&dir.join(rel), &text)?;
    }
    // Seed the lock file from the checkout so the crate resolves the exact versions the
    // workspace built (and can reuse them from the shared target directory).
    let lock = dir.join("Cargo.lock");
    let source_lock = paths.checkout.join("Cargo.lock");
    let stale = match (
        std::fs::metadata(&lock).and_then(|m| m.modified()),
        std::fs::metadata(&source_lock).and_then(|m| m.modified()),
    ) {
        (Ok(ours), Ok(theirs)) => theirs > ours,
        (Err(_), Ok(_)) => true,
        _ => false,
    };
    if stale {
        std::fs::copy(&source_lock, &lock).map_err(|source| BuildError::Io {
            path: lock.clone(),
            source,
        })?;
    }
    Ok(WrittenCrate { dir, rendered })
}

fn write_if_changed(path: &Path, text: &str) -> Result<(), BuildError> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| BuildError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// `text` formatted by rustfmt when it is installed (the templates are formatted already; this
/// keeps substituted values tidy), else unchanged.
fn rustfmt(text: &str) -> String {
    use std::io::Write;
    let Ok(mut child) = Command::new("rustfmt")
        .args(["--edition", "2024", "--emit", "stdout", "--quiet"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
    else {
        return text.to_owned();
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(text.as_bytes());
    }
    match child.wait_with_output() {
        Ok(out) if out.status.success() && !out.stdout.is_empty() => {
            String::from_utf8(out.stdout).unwrap_or_else(|_| text.to_owned())
        }
        _ => text.to_owned(),
    }
}

/// The cargo command building `krate`. `$VERLC_CARGO` replaces the program (e.g. a wrapper
/// script), else `$CARGO`, else `cargo`.
pub fn cargo_command(krate: &WrittenCrate, paths: &Paths, profile: Profile) -> Command {
    let mut cmd = Command::new(cargo_program());
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(krate.dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&paths.target)
        .args(["--message-format", "json"]);
    if profile == Profile::Release {
        cmd.arg("--release");
    }
    forget_calling_package(&mut cmd);
    libtorch_env(&mut cmd, &paths.checkout);
    cmd
}

/// The cargo verlc runs: `$VERLC_CARGO`, else the one running verlc (`$CARGO`), else `cargo`.
fn cargo_program() -> std::ffi::OsString {
    std::env::var_os("VERLC_CARGO")
        .or_else(|| std::env::var_os("CARGO"))
        .unwrap_or_else(|| "cargo".into())
}

/// How many compiler artifacts the build of `krate` produces when nothing is fresh: one per
/// package of its dependency graph on this host, plus one per build script (cargo reports
/// each as an artifact, fresh or compiled, so "N of M" counts down to the end). `None` when
/// `cargo metadata` cannot say (the build itself then reports what is wrong).
pub fn planned_artifacts(krate: &WrittenCrate, paths: &Paths) -> Option<usize> {
    let host = Command::new("rustc").arg("-vV").output().ok()?;
    let host = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))?;
    let mut cmd = Command::new(cargo_program());
    cmd.args([
        "metadata",
        "--format-version",
        "1",
        "--filter-platform",
        &host,
    ])
    .arg("--manifest-path")
    .arg(krate.dir.join("Cargo.toml"));
    forget_calling_package(&mut cmd);
    libtorch_env(&mut cmd, &paths.checkout);
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    count_artifacts(&serde_json::from_slice(&out.stdout).ok()?)
}

/// [`planned_artifacts`] of a `cargo metadata` document.
fn count_artifacts(meta: &serde_json::Value) -> Option<usize> {
    let with_build_script: std::collections::HashSet<&str> = meta["packages"]
        .as_array()?
        .iter()
        .filter(|p| {
            p["targets"].as_array().is_some_and(|ts| {
                ts.iter().any(|t| {
                    t["kind"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k == "custom-build"))
                })
            })
        })
        .filter_map(|p| p["id"].as_str())
        .collect();
    let nodes = meta["resolve"]["nodes"].as_array()?;
    let scripts = nodes
        .iter()
        .filter(|n| {
            n["id"]
                .as_str()
                .is_some_and(|id| with_build_script.contains(id))
        })
        .count();
    Some(nodes.len() + scripts)
}

/// Drops what cargo set for the package that runs verlc (`cargo run -p verlc`, a test of the
/// workspace): `CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ... Build scripts that track one of them
/// (ring's tracks `CARGO_MANIFEST_DIR`) would otherwise see a changed value and rebuild, with
/// everything above them, the crates the workspace compiled.
fn forget_calling_package(cmd: &mut Command) {
    const SET_FOR_A_PACKAGE: [&str; 6] = [
        "CARGO_MANIFEST_",
        "CARGO_PKG_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
    ];
    for (key, _) in std::env::vars_os() {
        let name = key.to_string_lossy();
        if SET_FOR_A_PACKAGE.iter().any(|p| name.starts_with(p)) || name == "OUT_DIR" {
            cmd.env_remove(&key);
        }
    }
}

/// What `scripts/cargo-env` sets, when the caller did not: torch-sys then finds the checkout's
/// `.venv` torch. (Unset, torch-sys would try to download libtorch.)
fn libtorch_env(cmd: &mut Command, checkout: &Path) {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if set("LIBTORCH") || set("LIBTORCH_USE_PYTORCH") {
        return;
    }
    let venv = checkout.join(".venv");
    if !venv.join("bin/python").is_file() {
        return;
    }
    let mut path = std::ffi::OsString::from(venv.join("bin"));
    if let Some(p) = std::env::var_os("PATH") {
        path.push(":");
        path.push(p);
    }
    cmd.env("VIRTUAL_ENV", &venv)
        .env("PATH", path)
        .env("LIBTORCH_USE_PYTORCH", "1");
}

/// Build a written crate; returns the path of the binary inside the shared target directory.
pub fn build(
    krate: &WrittenCrate,
    paths: &Paths,
    profile: Profile,
    on_event: &mut dyn FnMut(Event),
) -> Result<cargo::Built, BuildError> {
    cargo::run(
        cargo_command(krate, paths, profile),
        &krate.rendered.package,
        on_event,
    )
}

#[cfg(test)]
mod tests {
    use super::count_artifacts;

    #[test]
    fn artifacts_are_packages_plus_build_scripts() {
        let meta = serde_json::json!({
            "packages": [
                {"id": "a", "targets": [{"kind": ["lib"]}, {"kind": ["custom-build"]}]},
                {"id": "b", "targets": [{"kind": ["proc-macro"]}]},
                {"id": "unused", "targets": [{"kind": ["lib"]}, {"kind": ["custom-build"]}]},
                {"id": "trainer", "targets": [{"kind": ["bin"]}, {"kind": ["custom-build"]}]}
            ],
            "resolve": {"nodes": [{"id": "a"}, {"id": "b"}, {"id": "trainer"}]}
        });
        assert_eq!(count_artifacts(&meta), Some(5));
        assert_eq!(count_artifacts(&serde_json::json!({})), None);
    }
}
