//! Running cargo on a generated crate: JSON messages on stdout (artifacts, compiler errors),
//! status lines on stderr (`Compiling tch v0.26.0`), reported as [`Event`]s while it runs and
//! summarized as a [`CargoFailure`] when it fails.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;

use super::BuildError;

/// Progress while cargo runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A status line of cargo's (`Compiling tch v0.26.0`, `Finished …`), trimmed.
    Status(String),
    /// One more crate (or build script run) is done; the running count.
    Artifact(usize),
}

/// Why cargo failed, in the words of the compiler and of cargo.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CargoFailure {
    /// Rendered compiler errors (`error[E0277]: …` with their snippets).
    pub compiler_errors: Vec<String>,
    /// cargo's own error report (`error: failed to run custom build command for …` and what
    /// the build script printed).
    pub cargo_errors: Vec<String>,
    /// A likely fix, when the failure is a known one (libtorch not found).
    pub hint: Option<String>,
}

impl std::fmt::Display for CargoFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for e in &self.compiler_errors {
            writeln!(f, "{}", e.trim_end())?;
        }
        if !self.cargo_errors.is_empty() {
            writeln!(f, "{}", self.cargo_errors.join("\n").trim_end())?;
        }
        if let Some(h) = &self.hint {
            writeln!(f, "help: {h}")?;
        }
        Ok(())
    }
}

/// What a successful build produced.
#[derive(Clone, Debug)]
pub struct Built {
    pub executable: PathBuf,
    /// The packages this build compiled (not found fresh), as `name@version`, in cargo's
    /// order: from a warm target directory, only the generated crate.
    pub compiled: Vec<String>,
}

/// `name@version` of a cargo package id (`registry+…#tch@0.26.0`, `path+file:///x/foo#0.1.0`
/// where the name is the path's last segment, or the legacy `tch 0.26.0 (registry+…)`).
fn package_name(id: &str) -> String {
    if let Some((url, frag)) = id.rsplit_once('#') {
        if frag.contains('@') {
            return frag.to_owned();
        }
        let name = url.trim_end_matches('/').rsplit('/').next().unwrap_or(url);
        return format!("{name}@{frag}");
    }
    let mut words = id.split_whitespace();
    match (words.next(), words.next()) {
        (Some(n), Some(v)) => format!("{n}@{v}"),
        _ => id.to_owned(),
    }
}

/// Run `cmd` (a `cargo build … --message-format json`) to completion, reporting progress.
/// `package` is the crate whose binary is wanted.
pub fn run(
    mut cmd: Command,
    package: &str,
    on_event: &mut dyn FnMut(Event),
) -> Result<Built, BuildError> {
    let program = format!("{:?}", cmd.get_program());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| BuildError::Spawn {
            program: program.clone(),
            source,
        })?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(BuildError::Spawn {
            program,
            source: std::io::Error::other("no pipes to cargo"),
        });
    };

    // Both streams feed one channel so events come out in order and neither pipe fills up.
    enum Line {
        Out(String),
        Err(String),
    }
    let (tx, rx) = mpsc::channel();
    let tx_err = tx.clone();
    let err_thread = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx_err.send(Line::Err(line)).is_err() {
                break;
            }
        }
    });
    let out_thread = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(Line::Out(line)).is_err() {
                break;
            }
        }
    });

    let mut failure = CargoFailure::default();
    let mut stderr_log: Vec<String> = Vec::new();
    let mut artifacts = 0usize;
    let mut compiled: Vec<String> = Vec::new();
    let mut executable = None;
    for line in rx {
        match line {
            Line::Err(l) => {
                let t = l.trim();
                if !t.is_empty() && !t.starts_with('{') {
                    on_event(Event::Status(t.to_owned()));
                }
                stderr_log.push(l);
            }
            Line::Out(l) => {
                let Ok(msg) = serde_json::from_str::<serde_json::Value>(&l) else {
                    continue;
                };
                match msg.get("reason").and_then(|r| r.as_str()) {
                    Some("compiler-artifact") | Some("build-script-executed") => {
                        artifacts += 1;
                        on_event(Event::Artifact(artifacts));
                        let fresh = msg.get("fresh").and_then(|f| f.as_bool());
                        if fresh == Some(false)
                            && let Some(id) = msg.get("package_id").and_then(|p| p.as_str())
                        {
                            let name = package_name(id);
                            if !compiled.contains(&name) {
                                compiled.push(name);
                            }
                        }
                        let is_ours =
                            msg.pointer("/target/name").and_then(|n| n.as_str()) == Some(package);
                        if let Some(exe) = msg
                            .get("executable")
                            .and_then(|e| e.as_str())
                            .filter(|_| is_ours)
                        {
                            executable = Some(PathBuf::from(exe));
                        }
                    }
                    Some("compiler-message") => {
                        let level = msg.pointer("/message/level").and_then(|l| l.as_str());
                        if matches!(
                            level,
                            Some("error") | Some("error: internal compiler error")
                        ) && let Some(r) =
                            msg.pointer("/message/rendered").and_then(|r| r.as_str())
                        {
                            failure.compiler_errors.push(r.to_owned());
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    let _ = err_thread.join();
    let _ = out_thread.join();
    let status = child
        .wait()
        .map_err(|source| BuildError::Spawn { program, source })?;
    if status.success() {
        return executable
            .map(|executable| Built {
                executable,
                compiled,
            })
            .ok_or(BuildError::NoBinary);
    }

    // cargo's own report starts at its first `error` line ("could not compile" summaries of
    // compiler errors already shown are dropped).
    if let Some(start) = stderr_log.iter().position(|l| l.starts_with("error")) {
        failure.cargo_errors = stderr_log[start..]
            .iter()
            .filter(|l| {
                failure.compiler_errors.is_empty() || !l.starts_with("error: could not compile")
            })
            .cloned()
            .collect();
    }
    if failure.compiler_errors.is_empty() && failure.cargo_errors.is_empty() {
        let tail = stderr_log.len().saturating_sub(30);
        failure.cargo_errors = stderr_log[tail..].to_vec();
        failure
            .cargo_errors
            .push(format!("cargo exited with {status}"));
    }
    let all = failure.cargo_errors.join("\n");
    if all.contains("torch-sys")
        || all.contains("libtorch")
        || all.contains("DEP_TCH_LIBTORCH_LIB")
        || all.contains("verlc-runtime") && all.contains("build command")
    {
        failure.hint = Some(
            "libtorch is needed to build trainers: run scripts/setup in the verlc checkout (it installs torch into .venv), \
             or set LIBTORCH=<path to torch> or LIBTORCH_USE_PYTORCH=1 with a Python that has torch"
                .into(),
        );
    }
    Err(BuildError::Cargo(failure))
}

#[cfg(test)]
mod tests {
    use super::package_name;

    #[test]
    fn package_names_from_every_id_format() {
        let reg = "registry+https://github.com/rust-lang/crates.io-index#tch@0.26.0";
        assert_eq!(package_name(reg), "tch@0.26.0");
        assert_eq!(
            package_name("path+file:///home/user/verlc/runtime#verlc-runtime@0.1.0"),
            "verlc-runtime@0.1.0"
        );
        assert_eq!(
            package_name("path+file:///home/user/verlc/macros#0.1.0"),
            "macros@0.1.0"
        );
        assert_eq!(
            package_name("tch 0.26.0 (registry+https://github.com/rust-lang/crates.io-index)"),
            "tch@0.26.0"
        );
    }
}
