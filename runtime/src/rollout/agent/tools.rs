//! The tools of `rollout.multi_turn` in a Python helper process (`tool_host.py`, the protocol
//! at its top): verl's BaseTool classes from `tool_config_path` and `@function_tool` functions
//! from `function_tool_path`. Each turn's calls are one request; requests run concurrently in
//! the host and are collected as they finish, so the agent loop goes on with the trajectories
//! whose tools answered. A call that raises or runs past the call timeout gets verl's error
//! text (the model sees it) from the host; a host that crashes, or stops answering altogether
//! (a tool that blocks its event loop), is restarted, and the calls it had get
//! `Error executing tool '<name>': ...` saying so, so one bad tool call ends neither the batch
//! nor the run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::pyproc::{JsonLinesProcess, ProcError};

use super::hermes::FunctionCall;
use super::turns::{ToolOutcome, ToolRunner, tool_failed, unknown_tool};

const HOST: &str = include_str!("tool_host.py");

/// How to start the tool host.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSettings {
    pub python: String,
    /// `multi_turn.tool_config_path`.
    pub tool_config: Option<PathBuf>,
    /// `multi_turn.function_tool_path`.
    pub function_tools: Option<PathBuf>,
    /// Longest wait for the tools to load.
    pub startup_timeout: Duration,
    /// Longest time one call may take.
    pub call_timeout: Duration,
}

/// Errors of starting the tools (a call's failure is an outcome, not an error).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("tools ({what}): {source}")]
    Host { what: String, source: ProcError },
    #[error("tools failed to load:\n{0}")]
    Load(String),
}

/// The running tools.
pub struct PythonTools {
    settings: ToolSettings,
    host: JsonLinesProcess,
    names: Vec<String>,
    schemas: Vec<Value>,
    next_id: u64,
    /// Requests the host has not answered, by id.
    pending: BTreeMap<u64, Pending>,
    /// Turns answered without the host (every call to an unknown tool).
    answered: Vec<(usize, Vec<ToolOutcome>)>,
    /// Per sample: `tools_kwargs` (`{tool: {"create_kwargs": {...}}}`), set per batch.
    pub tools_kwargs: Vec<Map<String, Value>>,
}

/// One turn's calls in the host.
struct Pending {
    sample: usize,
    calls: Vec<FunctionCall>,
    /// The outcomes so far: unknown tools answered; the rest filled by the reply.
    outcomes: Vec<ToolOutcome>,
    /// Indices of the calls sent to the host.
    sent: Vec<usize>,
    deadline: Instant,
}

/// Beyond a call's own timeout (which the host enforces), how long the host may take to
/// answer before it is taken for stuck.
const HOST_GRACE: Duration = Duration::from_secs(10);
/// After the first turn finishes, how long to wait for more (fast tools finish together and
/// generate in one batch).
const GATHER: Duration = Duration::from_millis(20);

impl std::fmt::Debug for PythonTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonTools")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

fn arg(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

impl PythonTools {
    /// Starts the host and loads the tools.
    pub fn start(settings: ToolSettings) -> Result<Self, ToolError> {
        let (host, names, schemas) = Self::launch(&settings)?;
        Ok(PythonTools {
            settings,
            host,
            names,
            schemas,
            next_id: 0,
            pending: BTreeMap::new(),
            answered: Vec::new(),
            tools_kwargs: Vec::new(),
        })
    }

    fn launch(
        settings: &ToolSettings,
    ) -> Result<(JsonLinesProcess, Vec<String>, Vec<Value>), ToolError> {
        let host_err = |what: &str| {
            let what = what.to_owned();
            move |source| ToolError::Host { what, source }
        };
        let args = [
            arg(&settings.tool_config),
            arg(&settings.function_tools),
            settings.call_timeout.as_secs_f64().to_string(),
        ];
        let mut host = JsonLinesProcess::spawn(&settings.python, HOST, &args, "tool")
            .map_err(host_err("starting"))?;
        let ready = host
            .read(settings.startup_timeout, "loading the tools")
            .map_err(host_err("loading"))?;
        if ready.get("ready") != Some(&Value::Bool(true)) {
            let tb = ready
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no reason given");
            return Err(ToolError::Load(tb.trim_end().to_owned()));
        }
        let names = ready
            .get("names")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let schemas = ready
            .get("schemas")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        Ok((host, names, schemas))
    }

    /// The tools' OpenAI function schemas (what the chat template offers the model).
    pub fn schemas(&self) -> &[Value] {
        &self.schemas
    }

    /// The tools' names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    fn create_kwargs(&self, sample: usize, tool: &str) -> Value {
        self.tools_kwargs
            .get(sample)
            .and_then(|k| k.get(tool))
            .and_then(|t| t.get("create_kwargs"))
            .cloned()
            .unwrap_or_else(|| json!({}))
    }
}

impl PythonTools {
    /// Runs `calls` (of any samples) and waits for all of them: each sample's calls as one
    /// turn, outcomes in the order of `calls`.
    pub fn run(&mut self, calls: &[(usize, FunctionCall)]) -> Vec<ToolOutcome> {
        let mut turns: Vec<(usize, Vec<usize>)> = Vec::new();
        for (k, (sample, _)) in calls.iter().enumerate() {
            match turns.iter_mut().find(|(s, _)| s == sample) {
                Some((_, ks)) => ks.push(k),
                None => turns.push((*sample, vec![k])),
            }
        }
        for (sample, ks) in &turns {
            self.submit(*sample, ks.iter().map(|&k| calls[k].1.clone()).collect());
        }
        let mut by_sample: BTreeMap<usize, Vec<ToolOutcome>> = BTreeMap::new();
        while by_sample.len() < turns.len() {
            let done = self.finished(true);
            if done.is_empty() {
                break;
            }
            by_sample.extend(done);
        }
        let mut out = vec![tool_failed("", "no answer"); calls.len()];
        for (sample, ks) in turns {
            for (k, o) in ks
                .into_iter()
                .zip(by_sample.remove(&sample).unwrap_or_default())
            {
                out[k] = o;
            }
        }
        out
    }

    /// Takes the host's answer `reply` for its pending request.
    fn take_reply(&mut self, reply: Map<String, Value>) -> Option<(usize, Vec<ToolOutcome>)> {
        let id = reply.get("id").and_then(Value::as_u64)?;
        let mut p = self.pending.remove(&id)?;
        let results = reply
            .get("results")
            .and_then(Value::as_array)
            .filter(|a| a.len() == p.sent.len());
        match results {
            Some(results) => {
                for (&k, r) in p.sent.iter().zip(results) {
                    p.outcomes[k] = ToolOutcome {
                        text: r
                            .get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        reward: r.get("reward").and_then(Value::as_f64),
                        failed: r.get("failed").and_then(Value::as_bool).unwrap_or(false),
                    };
                }
            }
            None => {
                for &k in &p.sent {
                    p.outcomes[k] = tool_failed(
                        &p.calls[k].name,
                        "the tool process answered out of protocol",
                    );
                }
            }
        }
        Some((p.sample, p.outcomes))
    }

    /// Fails every pending call with `why`, and starts a fresh host for what comes next.
    fn restart(&mut self, why: &str) -> Vec<(usize, Vec<ToolOutcome>)> {
        eprintln!("verlc: the tool process failed ({why}); restarting it");
        let failed = std::mem::take(&mut self.pending)
            .into_values()
            .map(|mut p| {
                for &k in &p.sent {
                    p.outcomes[k] = tool_failed(&p.calls[k].name, why);
                }
                (p.sample, p.outcomes)
            })
            .collect();
        self.host.stop();
        match Self::launch(&self.settings) {
            Ok((host, _, _)) => self.host = host,
            Err(e) => eprintln!("verlc: the tool process did not restart: {e}"),
        }
        failed
    }
}

impl ToolRunner for PythonTools {
    fn submit(&mut self, sample: usize, calls: Vec<FunctionCall>) {
        // Unknown names are answered here, as verl's loop does, without the host.
        let outcomes: Vec<ToolOutcome> = calls
            .iter()
            .map(|c| unknown_tool(&c.name, &self.names))
            .collect();
        let sent: Vec<usize> = (0..calls.len())
            .filter(|&k| self.names.contains(&calls[k].name))
            .collect();
        if sent.is_empty() {
            self.answered.push((sample, outcomes));
            return;
        }
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({
            "id": id,
            "calls": sent.iter().map(|&k| {
                let c = &calls[k];
                json!({"name": c.name, "arguments": c.arguments,
                       "create_kwargs": self.create_kwargs(sample, &c.name)})
            }).collect::<Vec<_>>(),
        });
        // A host that is gone shows when its replies are awaited.
        let _ = self.host.send(&request);
        self.pending.insert(
            id,
            Pending {
                sample,
                calls,
                outcomes,
                sent,
                deadline: Instant::now() + self.settings.call_timeout + HOST_GRACE,
            },
        );
    }

    fn finished(&mut self, wait: bool) -> Vec<(usize, Vec<ToolOutcome>)> {
        let mut out = std::mem::take(&mut self.answered);
        let mut first_wait = wait && out.is_empty();
        while !self.pending.is_empty() {
            let now = Instant::now();
            let deadline = self
                .pending
                .values()
                .map(|p| p.deadline)
                .min()
                .unwrap_or(now);
            let patience = if first_wait {
                deadline.saturating_duration_since(now)
            } else if out.is_empty() && !wait {
                Duration::ZERO
            } else {
                GATHER
            };
            let what = format!(
                "running {} tool call(s)",
                self.pending.values().map(|p| p.sent.len()).sum::<usize>()
            );
            match self.host.poll(patience, &what) {
                Ok(Some(reply)) => {
                    if let Some(turn) = self.take_reply(reply) {
                        out.push(turn);
                        first_wait = false;
                    }
                }
                Ok(None) if first_wait => {
                    let why = format!(
                        "timed out: the tool process did not answer within {:.0} s",
                        (self.settings.call_timeout + HOST_GRACE).as_secs_f64()
                    );
                    out.extend(self.restart(&why));
                    break;
                }
                Ok(None) => break,
                Err(e) => {
                    out.extend(self.restart(&e.to_string()));
                    break;
                }
            }
        }
        out
    }
}
