//! `custom_reward_function.path/name`: the user's Python `compute_score` in a long-lived
//! subprocess, spoken to over JSON lines (the protocol is at the top of `server.py`).
//!
//! The function is called as verl calls it: `compute_score(data_source=…, solution_str=…,
//! ground_truth=…, extra_info=…, **reward_kwargs)`; async functions are awaited; a float, an
//! int/bool, a dict with `"score"` or a sequence (its first item) is accepted.
//!
//! Failures are errors, never hangs: an import error or a raised exception comes back with
//! its traceback; a process that dies is reported with its exit status and the last lines
//! of its stderr; a call that takes longer than the timeout kills the process. The user's
//! prints go to this process's stderr, prefixed `[reward]`.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{RewardError, Score, ScoreItem};

const SERVER: &str = include_str!("server.py");
const STDERR_TAIL: usize = 40;

/// How to start the reward server.
#[derive(Debug, Clone, PartialEq)]
pub struct PythonSettings {
    /// The interpreter (`$VERLC_PYTHON`, the active virtualenv's python, or `python3`).
    pub python: String,
    /// `custom_reward_function.path`.
    pub path: PathBuf,
    /// `custom_reward_function.name`.
    pub name: String,
    /// `custom_reward_function.reward_kwargs`, passed as keyword arguments.
    pub reward_kwargs: Map<String, Value>,
    /// Longest wait for the module to import.
    pub startup_timeout: Duration,
    /// Longest wait for one batch of scores.
    pub call_timeout: Duration,
}

impl PythonSettings {
    /// The default interpreter: `$VERLC_PYTHON`, else `$VIRTUAL_ENV/bin/python`, else `python3`.
    pub fn default_python() -> String {
        if let Ok(p) = std::env::var("VERLC_PYTHON")
            && !p.is_empty()
        {
            return p;
        }
        if let Ok(v) = std::env::var("VIRTUAL_ENV") {
            let p = PathBuf::from(v).join("bin").join("python");
            if p.is_file() {
                return p.display().to_string();
            }
        }
        "python3".to_owned()
    }
}

/// A running reward server.
pub struct PythonRewardFn {
    settings: PythonSettings,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_thread: Option<JoinHandle<()>>,
    next_id: u64,
    /// Set when the server is gone; every later call fails with it.
    dead: Option<String>,
}

impl std::fmt::Debug for PythonRewardFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonRewardFn")
            .field("settings", &self.settings)
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

impl PythonRewardFn {
    /// Starts the server and waits until the user's module is imported.
    pub fn start(settings: PythonSettings) -> Result<Self, RewardError> {
        if !settings.path.is_file() {
            return Err(RewardError::Python {
                path: settings.path.display().to_string(),
                name: settings.name.clone(),
                msg: "no such file (custom_reward_function.path)".into(),
            });
        }
        let kwargs = Value::Object(settings.reward_kwargs.clone()).to_string();
        let mut child = Command::new(&settings.python)
            .arg("-u")
            .arg("-c")
            .arg(SERVER)
            .arg(&settings.path)
            .arg(&settings.name)
            .arg(kwargs)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| RewardError::Spawn {
                python: settings.python.clone(),
                source,
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
        let stderr_thread = child.stderr.take().map(|err| {
            let tail = Arc::clone(&tail);
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    eprintln!("[reward] {line}");
                    if let Ok(mut t) = tail.lock() {
                        if t.len() == STDERR_TAIL {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                }
            })
        });
        let mut server = PythonRewardFn {
            settings,
            child,
            stdin,
            lines: rx,
            stderr_tail: tail,
            stderr_thread,
            next_id: 0,
            dead: None,
        };
        let ready = server.read_reply(server.settings.startup_timeout, "importing the module")?;
        match ready.get("ready") {
            Some(Value::Bool(true)) => Ok(server),
            _ => {
                let tb = ready
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
                    .to_owned();
                server.stop();
                Err(server.error(format!("failed to load:\n{}", tb.trim_end())))
            }
        }
    }

    fn error(&self, msg: String) -> RewardError {
        RewardError::Python {
            path: self.settings.path.display().to_string(),
            name: self.settings.name.clone(),
            msg,
        }
    }

    fn stop(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(t) = self.stderr_thread.take() {
            let _ = t.join();
        }
    }

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

    /// The next protocol line, or an error when the server exits or `timeout` passes.
    fn read_reply(
        &mut self,
        timeout: Duration,
        what: &str,
    ) -> Result<Map<String, Value>, RewardError> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => match serde_json::from_str::<Value>(&line) {
                Ok(Value::Object(m)) => Ok(m),
                _ => {
                    let msg = format!("sent a line that is not protocol JSON: {line:?}");
                    self.dead = Some(msg.clone());
                    self.stop();
                    Err(self.error(msg))
                }
            },
            Err(RecvTimeoutError::Timeout) => {
                self.dead = Some(format!("timed out while {what}"));
                self.stop();
                Err(RewardError::Timeout {
                    path: self.settings.path.display().to_string(),
                    name: self.settings.name.clone(),
                    seconds: timeout.as_secs_f64(),
                    what: what.to_owned(),
                })
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.stdin = None;
                let status = match self.child.wait() {
                    Ok(s) => s.to_string(),
                    Err(e) => format!("unknown status ({e})"),
                };
                if let Some(t) = self.stderr_thread.take() {
                    let _ = t.join();
                }
                let msg = format!(
                    "the reward process exited ({status}) while {what}{}",
                    self.tail()
                );
                self.dead = Some(msg.clone());
                Err(self.error(msg))
            }
        }
    }

    /// Scores `items` in one request.
    pub fn score(&mut self, items: &[ScoreItem]) -> Result<Vec<Score>, RewardError> {
        if let Some(why) = &self.dead {
            return Err(self.error(format!("the reward process is no longer running ({why})")));
        }
        self.next_id += 1;
        let id = self.next_id;
        let req = json!({
            "id": id,
            "items": items.iter().map(|it| json!({
                "data_source": it.data_source,
                "solution_str": it.solution_str,
                "ground_truth": it.ground_truth,
                "extra_info": Value::Object(it.extra_info.clone()),
            })).collect::<Vec<_>>(),
        });
        let sent = match self.stdin.as_mut() {
            Some(stdin) => writeln!(stdin, "{req}").and_then(|_| stdin.flush()),
            None => Err(std::io::Error::other("stdin closed")),
        };
        // A failed write means the process is gone; read_reply reports how it ended.
        let _ = sent;
        let what = format!("scoring {} responses", items.len());
        let reply = self.read_reply(self.settings.call_timeout, &what)?;
        if reply.get("id").and_then(Value::as_u64) != Some(id) {
            return Err(self.error(format!(
                "answered request {:?}, expected {id}",
                reply.get("id")
            )));
        }
        if let Some(tb) = reply.get("error").and_then(Value::as_str) {
            return Err(self.error(format!("raised an exception:\n{}", tb.trim_end())));
        }
        let results = reply
            .get("results")
            .and_then(Value::as_array)
            .ok_or_else(|| self.error("reply without results".into()))?;
        if results.len() != items.len() {
            return Err(self.error(format!(
                "returned {} scores for {} responses",
                results.len(),
                items.len()
            )));
        }
        results
            .iter()
            .zip(items)
            .map(|(r, it)| {
                let score = match r.get("score").and_then(Value::as_f64) {
                    Some(s) => s,
                    None => {
                        let bad = r
                            .get("bad")
                            .and_then(Value::as_str)
                            .unwrap_or("a non-number");
                        return Err(self.error(format!(
                            "returned {bad} for data_source={:?}; scores must be finite numbers",
                            it.data_source
                        )));
                    }
                };
                let extra: BTreeMap<String, Value> = r
                    .get("extra")
                    .and_then(Value::as_object)
                    .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                    .unwrap_or_default();
                let from_dict = r.get("dict").and_then(Value::as_bool).unwrap_or(false);
                Ok(Score {
                    score,
                    extra,
                    from_dict,
                })
            })
            .collect()
    }
}

impl Drop for PythonRewardFn {
    fn drop(&mut self) {
        // Closing stdin ends the server's loop; kill covers a server stuck in user code.
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
