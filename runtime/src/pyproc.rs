//! A long-lived Python helper process spoken to over JSON lines: one JSON object per line on
//! its stdin and stdout (`pyproc_channel.py`, run ahead of every helper script, gives it
//! `protocol_sender()`, which moves the user's prints to stderr), stderr relayed with a
//! prefix and its last lines kept for error messages. Every wait is bounded: a reply that does
//! not come within its timeout kills the process; a process that exits is reported with its
//! status and last stderr lines; afterwards every request fails with the first reason.
//! Reward functions (`workers::reward::python`) and tools (`rollout::agent::tools`) run here.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Map, Value};

const STDERR_TAIL: usize = 40;

/// How long a stopped helper's stderr may take to reach its end.
const STDERR_DRAIN: Duration = Duration::from_secs(2);

/// The helper's side of the protocol, run ahead of its script.
const CHANNEL: &str = include_str!("pyproc_channel.py");

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

/// A running helper.
pub struct JsonLinesProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_thread: Option<JoinHandle<()>>,
    dead: Option<ProcError>,
}

impl std::fmt::Debug for JsonLinesProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLinesProcess")
            .field("pid", &self.child.id())
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

impl JsonLinesProcess {
    /// Runs `python -u -c script args...` (with `pyproc_channel.py` ahead of `script`); its
    /// stderr lines are printed as `[tag] line`.
    pub fn spawn(
        python: &str,
        script: &str,
        args: &[String],
        tag: &str,
    ) -> Result<Self, ProcError> {
        let mut child = Command::new(python)
            .arg("-u")
            .arg("-c")
            .arg(format!("{CHANNEL}{script}"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ProcError::Spawn {
                python: python.to_owned(),
                message: e.to_string(),
            })?;
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let tag = tag.to_owned();
        let stderr_thread = child.stderr.take().map(|err| {
            let tail = Arc::clone(&tail);
            std::thread::spawn(move || {
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
            })
        });
        Ok(JsonLinesProcess {
            child,
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
        kill_tree(&mut self.child);
        let _ = self.child.wait();
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
                let status = match self.child.wait() {
                    Ok(s) => s.to_string(),
                    Err(e) => format!("unknown status ({e})"),
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
        kill_tree(&mut self.child);
        let _ = self.child.wait();
    }
}

/// Kills `child` and every process under it. The interpreter may be a wrapper (a shell
/// script, `conda run`, `time`) whose Python is a grandchild: killing only the direct child
/// would leave a helper stuck in user code running, holding the pipes.
fn kill_tree(child: &mut Child) {
    let mut pending = vec![child.id()];
    let mut below = Vec::new();
    while let Some(pid) = pending.pop() {
        for kid in children_of(pid) {
            below.push(kid);
            pending.push(kid);
        }
    }
    for pid in below {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: sends a signal; no memory is touched.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = child.kill();
}

/// The processes `pid`'s threads started (Linux's `/proc/<pid>/task/<tid>/children`; empty
/// elsewhere).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}
