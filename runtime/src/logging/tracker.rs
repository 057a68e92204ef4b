//! `wandb` and `mlflow` loggers: the trackers' own Python SDKs in a long-lived side process
//! (`tracker.py`, fed JSON lines), set up as verl's `Tracking` sets them up: the project and
//! run names, the run's config (here the trainer spec), verl's metric names and steps, and the
//! environment (`WANDB_MODE`, `WANDB_ENTITY`, `MLFLOW_TRACKING_URI`, `MLFLOW_RUN_ID`, ...).
//!
//! A tracker never stops training: lines go through a channel to a writer thread (a stalled
//! tracker cannot block a step), and a process that fails to start or dies is reported once on
//! stderr (its own messages prefixed with the backend's name) while training goes on.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{LogError, Logger};
use crate::engine::Metrics;

const SCRIPT: &str = include_str!("tracker.py");

/// Which SDK the side process drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Wandb,
    Mlflow,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Wandb => "wandb",
            Backend::Mlflow => "mlflow",
        }
    }
}

/// How to start a tracker process.
#[derive(Debug, Clone, PartialEq)]
pub struct TrackerSettings {
    pub python: String,
    pub project: String,
    pub experiment: String,
    /// The run's config as the tracker records it.
    pub config: Value,
    /// Extra environment for the process (tests; otherwise it inherits the trainer's).
    pub env: Vec<(String, String)>,
    /// Longest wait at the end for the SDK to flush and exit (wandb syncs then).
    pub finish_timeout: Duration,
}

/// A running tracker process.
pub struct PythonTracker {
    backend: Backend,
    lines: Option<Sender<String>>,
    writer: Option<JoinHandle<()>>,
    stderr: Option<JoinHandle<()>>,
    child: Child,
    finish_timeout: Duration,
}

impl PythonTracker {
    /// Starts the process and sends it the run's setup; `None` (after a warning) when the
    /// interpreter cannot be started.
    pub fn start(backend: Backend, s: &TrackerSettings) -> Option<Self> {
        let name = backend.name();
        let mut cmd = Command::new(&s.python);
        cmd.args(["-u", "-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .envs(s.env.iter().map(|(k, v)| (k, v)));
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                eprintln!(
                    "warning: logger `{name}` is off: cannot start {} ({e}); training goes on",
                    s.python
                );
                return None;
            }
        };
        let stdin = child.stdin.take()?;
        let stderr = child.stderr.take().map(|err| {
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    eprintln!("[{name}] {line}");
                }
            })
        });
        let (tx, rx) = channel::<String>();
        let writer = std::thread::spawn(move || {
            let mut stdin = stdin;
            for line in rx {
                if writeln!(stdin, "{line}")
                    .and_then(|()| stdin.flush())
                    .is_err()
                {
                    eprintln!(
                        "warning: logger `{name}` stopped (its process ended; see its messages above); training goes on"
                    );
                    return;
                }
            }
        });
        let init = json!({"init": {
            "backend": name,
            "project": s.project,
            "experiment": s.experiment,
            "config": s.config,
        }});
        let _ = tx.send(init.to_string());
        Some(PythonTracker {
            backend,
            lines: Some(tx),
            writer: Some(writer),
            stderr,
            child,
            finish_timeout: s.finish_timeout,
        })
    }
}

impl Logger for PythonTracker {
    fn log(&mut self, step: u64, metrics: &Metrics) -> Result<(), LogError> {
        let data: serde_json::Map<String, Value> = metrics
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        if let Some(tx) = &self.lines {
            // A closed channel means the writer already said the tracker stopped.
            let _ = tx.send(json!({"log": {"step": step, "data": data}}).to_string());
        }
        Ok(())
    }

    fn finish(&mut self) {
        if let Some(tx) = self.lines.take() {
            let _ = tx.send(json!({"finish": {}}).to_string());
        }
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        // The writer closed stdin: the process ends once the SDK has flushed.
        let start = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if start.elapsed() > self.finish_timeout => {
                    eprintln!(
                        "warning: logger `{}` did not finish within {:?}; stopped it",
                        self.backend.name(),
                        self.finish_timeout
                    );
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        if let Some(e) = self.stderr.take() {
            let _ = e.join();
        }
    }
}

impl Drop for PythonTracker {
    fn drop(&mut self) {
        if self.lines.is_some() {
            self.finish();
        }
    }
}
