//! Which built-in verl tree a config composes against where it reaches verl's own tree
//! (no `--config-dir`, or one that is no verl tree itself, such as an example's `config/`
//! that extends `pkg://verl.trainer.config`): `--verl-version` when given, else the release of
//! the verl installed in the active Python (as Hydra would find `pkg://verl.trainer.config`
//! there; see [`installed_verl`]), else the newest release verlc carries. A config dir's own
//! release (its `verl/version/version`, or the tree its search path names) is found by the
//! front end and wins over all.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use verlc_front::load::version::{BuiltinRelease, verl_version};

/// The built-in tree to compose with, and a note for the user when the choice is not exact
/// (the active Python's verl is a release verlc carries no tree of).
pub fn choose(
    flag: Option<&str>,
    config_dir: Option<&Path>,
) -> Result<(BuiltinRelease, Option<String>), String> {
    if let Some(v) = flag {
        return BuiltinRelease::parse(v).map(|r| (r, None));
    }
    if config_dir.is_some_and(|d| verlc_front::load::version::verl_release(d).is_some()) {
        // A verl tree's own release decides (no Python is asked: `check` stays a few ms).
        return Ok((BuiltinRelease::default(), None));
    }
    let Some(installed) = installed_verl() else {
        return Ok((BuiltinRelease::default(), None));
    };
    Ok(
        match BuiltinRelease::ALL
            .into_iter()
            .find(|r| r.version() == installed.version)
        {
            Some(exact) => (exact, None),
            None => {
                let near = BuiltinRelease::same_minor(&installed.version).unwrap_or_default();
                let tree = installed.package.join("trainer/config");
                (
                    near,
                    Some(format!(
                        "note: the active Python has verl {}; verlc carries no tree of that release and judges against its built-in {} (for the exact tree: `--config-dir {}`)",
                        installed.version,
                        near.version(),
                        tree.display()
                    )),
                )
            }
        },
    )
}

/// A verl package found in a Python environment.
struct Installed {
    version: String,
    /// The `verl` package directory.
    package: PathBuf,
}

/// How long the active Python may take to say which verl it has (it imports nothing of
/// verl's: the package metadata and its location only).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The verl of the active Python, the interpreter a trainer runs reward functions with too:
/// `$VERLC_PYTHON` (an empty value: look in none), else the active virtualenv's, else
/// `python3` on PATH. Where the package is (found without importing it), and its release.
fn installed_verl() -> Option<Installed> {
    let venv = std::env::var_os("VIRTUAL_ENV")
        .filter(|v| !v.is_empty())
        .map(|v| PathBuf::from(v).join("bin/python"))
        .filter(|p| p.is_file());
    let python = match std::env::var_os("VERLC_PYTHON") {
        Some(p) if p.is_empty() => return None,
        Some(p) => PathBuf::from(p),
        None => venv.unwrap_or_else(|| PathBuf::from("python3")),
    };
    let mut child = Command::new(python)
        .args([
            "-c",
            "import importlib.util as u; print(list(u.find_spec('verl').submodule_search_locations)[0])",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < PROBE_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(2))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let out = child.wait_with_output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let package = PathBuf::from(text.lines().next()?.trim());
    // The release of the tree Hydra would read there (its version file, as for `--config-dir`).
    let version = verl_version(&package.join("trainer/config"))?;
    Some(Installed { version, package })
}
