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

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::pyproc::{JsonLinesProcess, ProcError};

use super::{RewardError, Score, ScoreItem};

const SERVER: &str = concat!(
    include_str!("../../pyproc/verl_prelude.py"),
    include_str!("server.py")
);

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
    /// The default interpreter ([`crate::pyproc::default_python`]).
    pub fn default_python() -> String {
        crate::pyproc::default_python()
    }
}

/// A running reward server.
pub struct PythonRewardFn {
    settings: PythonSettings,
    server: JsonLinesProcess,
    next_id: u64,
}

impl std::fmt::Debug for PythonRewardFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonRewardFn")
            .field("settings", &self.settings)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl PythonRewardFn {
    /// Starts the server and waits until the user's module is imported.
    pub fn start(settings: PythonSettings) -> Result<Self, RewardError> {
        // `pkg://<module>`: an installed module (verl's scorers), imported by name.
        let installed = settings.path.to_string_lossy().starts_with("pkg://");
        if !installed && !settings.path.is_file() {
            return Err(RewardError::Python {
                path: settings.path.display().to_string(),
                name: settings.name.clone(),
                msg: "no such file (custom_reward_function.path)".into(),
            });
        }
        let kwargs = Value::Object(settings.reward_kwargs.clone()).to_string();
        let args = [
            settings.path.display().to_string(),
            settings.name.clone(),
            kwargs,
        ];
        let server = JsonLinesProcess::spawn(&settings.python, SERVER, &args, "reward").map_err(
            |e| match e {
                ProcError::Spawn { python, message } => RewardError::Spawn {
                    python,
                    source: std::io::Error::other(message),
                },
                other => RewardError::Other(other.to_string()),
            },
        )?;
        let mut server = PythonRewardFn {
            settings,
            server,
            next_id: 0,
        };
        let timeout = server.settings.startup_timeout;
        let ready = server
            .server
            .read(timeout, "importing the module")
            .map_err(|e| server.error_of(e))?;
        match ready.get("ready") {
            Some(Value::Bool(true)) => Ok(server),
            _ => {
                let tb = ready
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
                    .to_owned();
                server.server.stop();
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

    /// The reward error of a failed wait on the server.
    fn error_of(&self, e: ProcError) -> RewardError {
        match e {
            ProcError::Timeout { seconds, what } => RewardError::Timeout {
                path: self.settings.path.display().to_string(),
                name: self.settings.name.clone(),
                seconds,
                what,
            },
            ProcError::Exited { status, what, tail } => self.error(format!(
                "the reward process exited ({status}) while {what}{tail}"
            )),
            ProcError::Dead(why) => {
                self.error(format!("the reward process is no longer running ({why})"))
            }
            other => self.error(other.to_string()),
        }
    }

    /// Scores `items` in one request.
    pub fn score(&mut self, items: &[ScoreItem]) -> Result<Vec<Score>, RewardError> {
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
        let what = format!("scoring {} responses", items.len());
        let reply = self
            .server
            .request(&req, self.settings.call_timeout, &what)
            .map_err(|e| self.error_of(e))?;
        if reply.get("id").and_then(Value::as_u64) != Some(id) {
            return Err(self.error(format!(
                "answered request {:?}, expected {id}",
                reply.get("id")
            )));
        }
        if let Some(tb) = reply.get("error").and_then(Value::as_str) {
            let err = self.error(format!("raised an exception:\n{}", tb.trim_end()));
            return Err(match reply.get("item").and_then(Value::as_u64) {
                Some(i) => RewardError::Sample {
                    index: usize::try_from(i).unwrap_or(usize::MAX),
                    source: Box::new(err),
                },
                None => err,
            });
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
            .enumerate()
            .map(|(index, (r, it))| {
                let score = match r.get("score").and_then(Value::as_f64) {
                    Some(s) => s,
                    None => {
                        let bad = r
                            .get("bad")
                            .and_then(Value::as_str)
                            .unwrap_or("a non-number");
                        return Err(RewardError::Sample {
                            index,
                            source: Box::new(self.error(format!(
                                "returned {bad} for data_source={:?}; scores must be finite numbers",
                                it.data_source
                            ))),
                        });
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
                    tokens: None,
                })
            })
            .collect()
    }
}
