//! A long-lived Python helper process spoken to over JSON lines: one JSON object per line on
//! its stdin and stdout (`pyproc/channel.py`, run ahead of every helper script, gives it
//! `protocol_sender()`, which moves the user's prints to stderr), stderr relayed with a
//! prefix and its last lines kept for error messages. Every wait is bounded: a reply that does
//! not come within its timeout kills the process; a process that exits is reported with its
//! status and last stderr lines; afterwards every request fails with the first reason.
//! Reward functions (`workers::reward::python`) and tools (`rollout::agent::tools`) run here.
//! A helper's process is started here, or forked from a warm interpreter when a fork server
//! is named (`process.rs`, `fork_client.rs`).

pub(crate) mod fork_client;
mod process;

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Map, Value};

const STDERR_TAIL: usize = 40;

/// How long a stopped helper's stderr may take to reach its end.
const STDERR_DRAIN: Duration = Duration::from_secs(2);

/// The helper's side of the protocol, run ahead of its script.
const CHANNEL: &str = include_str!("channel.py");

pub use fork_client::SOCKET_VAR as FORK_SERVER_VAR;

/// Why a request got no reply.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProcError {
    #[error("cannot start `{python}`: {message}")]
    Spawn { python: String, message: String },
    #[error("timed out after {seconds} s while {what}")]
    Timeout { seconds: f64, what: String },
    #[error("the process exited ({status}) while {what}{tail}")]
    Exited {
        status: String,
        what: String,
        tail: String,
    },
    #[error("{0}")]
    Protocol(String),
    #[error("the process is no longer running ({0})")]
    Dead(String),
}

/// The interpreter helper processes run on by default: `$VERLC_PYTHON`, else
/// `$VIRTUAL_ENV/bin/python`, else `python3`.
pub fn default_python() -> String {
    if let Ok(p) = std::env::var("VERLC_PYTHON")
        && !p.is_empty()
    {
        return p;
    }
    if let Ok(v) = std::env::var("VIRTUAL_ENV") {
        let p = std::path::PathBuf::from(v).join("bin").join("python");
        if p.is_file() {
            return p.display().to_string();
        }
    }
    "python3".to_owned()
}

/// The fork server's socket, where `VERLC_PYTHON_FORK_SERVER` names one.
fn fork_server_from_env() -> Option<PathBuf> {
    std::env::var_os(FORK_SERVER_VAR)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
}

/// Runs `python -u FILE ARGS...` to its end, with `env` set on top of this process's and an
/// empty stdin, and returns what `std::process::Command::output` would: forked by the fork
/// server `VERLC_PYTHON_FORK_SERVER` names where it takes the request (the tests' oracles
/// run this way, each saving the imports of torch and transformers).
pub fn run_file(
    python: &str,
    file: &Path,
    args: &[String],
    env: &[(&str, &str)],
) -> Result<std::process::Output, ProcError> {
    run_file_with_fork_server(python, file, args, env, fork_server_from_env().as_deref())
}

/// As [`run_file`], with the fork server at `fork_server` (`None`: started directly).
pub fn run_file_with_fork_server(
    python: &str,
    file: &Path,
    args: &[String],
    env: &[(&str, &str)],
    fork_server: Option<&Path>,
) -> Result<std::process::Output, ProcError> {
    let launch = process::Launch {
        python,
        program: process::Program::File(file),
        args,
        env,
    };
    let started = process::start(launch, fork_server)?;
    let process::Started {
        mut process,
        stdin,
        mut stdout,
        mut stderr,
    } = started;
    drop(stdin);
    let errors = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let mut out = Vec::new();
    let _ = stdout.read_to_end(&mut out);
    let err = errors.join().unwrap_or_default();
    let status = process.wait().map_err(ProcError::Dead)?;
    Ok(std::process::Output {
        status,
        stdout: out,
        stderr: err,
    })
}

/// A running helper.
pub struct JsonLinesProcess {
    process: process::HelperProcess,
    stdin: Option<File>,
    lines: Receiver<String>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_thread: Option<JoinHandle<()>>,
    dead: Option<ProcError>,
}

impl std::fmt::Debug for JsonLinesProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLinesProcess")
            .field("pid", &self.process.id())
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

impl JsonLinesProcess {
    /// Runs `python -u -c script args...` (with `pyproc/channel.py` ahead of `script`); its
    /// stderr lines are printed as `[tag] line`.
    pub fn spawn(
        python: &str,
        script: &str,
        args: &[String],
        tag: &str,
    ) -> Result<Self, ProcError> {
        let server = fork_server_from_env();
        Self::spawn_with_fork_server(python, script, args, tag, server.as_deref())
    }

    /// As `spawn`, forked by the fork server listening at `fork_server` where it takes the
    /// request (`None`: started directly).
    pub fn spawn_with_fork_server(
        python: &str,
        script: &str,
        args: &[String],
        tag: &str,
        fork_server: Option<&Path>,
    ) -> Result<Self, ProcError> {
        let code = format!("{CHANNEL}{script}");
        let launch = process::Launch {
            python,
            program: process::Program::Code(&code),
            args,
            env: &[],
        };
        let started = process::start(launch, fork_server)?;
        let stdin = Some(started.stdin);
        let out = started.stdout;
        let err = started.stderr;
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let tag = tag.to_owned();
        let stderr_thread = {
            let tail = Arc::clone(&tail);
            Some(std::thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    eprintln!("[{tag}] {line}");
                    if let Ok(mut t) = tail.lock() {
                        if t.len() == STDERR_TAIL {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                }
            }))
        };
        Ok(JsonLinesProcess {
            process: started.process,
            stdin,
            lines: rx,
            stderr_tail: tail,
            stderr_thread,
            dead: None,
        })
    }

    /// Kills the process (a helper stuck in user code included) and reaps it.
    pub fn stop(&mut self) {
        self.stdin = None;
        self.process.kill();
        let _ = self.process.wait();
        self.join_stderr();
    }

    /// Waits, a bounded time, for the stderr relay to see the end of the stream: a process
    /// the helper left behind that still holds the pipe must not hang the trainer (its lines
    /// then stop being relayed).
    fn join_stderr(&mut self) {
        let Some(t) = self.stderr_thread.take() else {
            return;
        };
        let deadline = std::time::Instant::now() + STDERR_DRAIN;
        while !t.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }

    /// `"; its last stderr lines:\n..."`, or empty.
    fn tail(&self) -> String {
        let lines: Vec<String> = self
            .stderr_tail
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        if lines.is_empty() {
            String::new()
        } else {
            format!("; its last stderr lines:\n{}", lines.join("\n"))
        }
    }

    fn fail(&mut self, e: ProcError) -> ProcError {
        self.dead = Some(e.clone());
        e
    }

    /// The next line as a JSON object, within `timeout` (`what` names the wait in errors);
    /// a process that does not answer in time is killed.
    pub fn read(&mut self, timeout: Duration, what: &str) -> Result<Map<String, Value>, ProcError> {
        match self.poll(timeout, what)? {
            Some(m) => Ok(m),
            None => {
                self.stop();
                let e = ProcError::Timeout {
                    seconds: timeout.as_secs_f64(),
                    what: what.to_owned(),
                };
                Err(self.fail(e))
            }
        }
    }

    /// The next line as a JSON object if one comes within `wait` (`None` otherwise; the
    /// process keeps running).
    pub fn poll(
        &mut self,
        wait: Duration,
        what: &str,
    ) -> Result<Option<Map<String, Value>>, ProcError> {
        if let Some(why) = &self.dead {
            return Err(ProcError::Dead(why.to_string()));
        }
        match self.lines.recv_timeout(wait) {
            Ok(line) => match serde_json::from_str::<Value>(&line) {
                Ok(Value::Object(m)) => Ok(Some(m)),
                _ => {
                    self.stop();
                    let e = ProcError::Protocol(format!(
                        "sent a line that is not protocol JSON: {line:?}"
                    ));
                    Err(self.fail(e))
                }
            },
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                self.stdin = None;
                let status = match self.process.wait() {
                    Ok(s) => s.to_string(),
                    Err(why) => why,
                };
                self.join_stderr();
                let e = ProcError::Exited {
                    status,
                    what: what.to_owned(),
                    tail: self.tail(),
                };
                Err(self.fail(e))
            }
        }
    }

    /// Sends `message` as one line without waiting for a reply.
    pub fn send(&mut self, message: &Value) -> Result<(), ProcError> {
        if let Some(why) = &self.dead {
            return Err(ProcError::Dead(why.to_string()));
        }
        if let Some(stdin) = self.stdin.as_mut() {
            // A failed write means the process is gone; the next read reports how it ended.
            let _ = writeln!(stdin, "{message}").and_then(|_| stdin.flush());
        }
        Ok(())
    }

    /// Sends `request` as one line and reads the reply.
    pub fn request(
        &mut self,
        request: &Value,
        timeout: Duration,
        what: &str,
    ) -> Result<Map<String, Value>, ProcError> {
        self.send(request)?;
        self.read(timeout, what)
    }
}

impl Drop for JsonLinesProcess {
    fn drop(&mut self) {
        // Closing stdin ends the helper's loop; kill covers one stuck in user code.
        self.stdin = None;
        self.process.kill();
        let _ = self.process.wait();
    }
}

#[cfg(test)]
mod tests;
