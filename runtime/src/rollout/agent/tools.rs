//! The tools of `rollout.multi_turn` in a Python helper process (`tool_host.py`, the protocol
//! at its top): verl's BaseTool classes from `tool_config_path`, `@function_tool` functions
//! from `function_tool_path`, and verl 0.7's interactions (a scripted user) from
//! `interaction_config_path`. Each turn's calls are one request, as is each interaction reply;
//! requests run concurrently in the host and are collected as they finish, so the agent loop
//! goes on with the trajectories that were answered. A call that raises or runs past the call
//! timeout gets verl's error text (the model sees it) from the host; a host that crashes, or
//! stops answering altogether (a tool that blocks its event loop), is restarted, and the calls
//! it had get `Error executing tool '<name>': ...` saying so, so one bad tool call ends neither
//! the batch nor the run. An interaction that fails is an error of the run (as in verl).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::pyproc::{JsonLinesProcess, ProcError};
use crate::tokenizer::chat::Message;

use super::hermes::FunctionCall;
use super::turns::{Answer, ToolOutcome, ToolRunner, UserReply, tool_failed, unknown_tool};

/// verl's modules for the user's tools (`pyproc/verl_prelude.py`), then the host.
const HOST: &str = concat!(
    include_str!("../../pyproc/verl_prelude.py"),
    include_str!("tool_host.py")
);

/// How to start the tool host.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSettings {
    pub python: String,
    /// `multi_turn.tool_config_path`.
    pub tool_config: Option<PathBuf>,
    /// `multi_turn.function_tool_path`.
    pub function_tools: Option<PathBuf>,
    /// `multi_turn.interaction_config_path`.
    pub interaction_config: Option<PathBuf>,
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
    interactions: Vec<String>,
    schemas: Vec<Value>,
    next_id: u64,
    /// Requests the host has not answered, by id.
    pending: BTreeMap<u64, Pending>,
    /// Turns answered without the host (every call to an unknown tool, a sample without
    /// interaction arguments).
    answered: Vec<(usize, Answer)>,
    /// Batches begun (interaction instances are named by batch and sample).
    batch: u64,
    /// Per sample of the batch: `tools_kwargs` (`{tool: {"create_kwargs": {...}}}`).
    tools_kwargs: Vec<Map<String, Value>>,
    /// Per sample of the batch: `interaction_kwargs` (`{name, ...}`), if it has them.
    interaction_kwargs: Vec<Option<Map<String, Value>>>,
}

/// One request in the host.
struct Pending {
    sample: usize,
    deadline: Instant,
    work: Work,
}

enum Work {
    /// A turn's calls: the outcomes so far (unknown tools answered), and the indices of the
    /// calls sent.
    Calls {
        calls: Vec<FunctionCall>,
        outcomes: Vec<ToolOutcome>,
        sent: Vec<usize>,
    },
    /// An interaction's reply.
    Reply,
}

impl Work {
    /// The answer to the request: each sent call's outcome from `outcome(i, sent, call)`
    /// (`i` its index among the `sent` calls), or the interaction's `reply`.
    fn answer(
        self,
        outcome: impl Fn(usize, usize, &FunctionCall) -> ToolOutcome,
        reply: impl FnOnce() -> Result<UserReply, String>,
    ) -> Answer {
        match self {
            Work::Calls {
                calls,
                mut outcomes,
                sent,
            } => {
                for (i, &k) in sent.iter().enumerate() {
                    outcomes[k] = outcome(i, sent.len(), &calls[k]);
                }
                Answer::Tools(outcomes)
            }
            Work::Reply => Answer::User(reply()),
        }
    }
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
            .field("interactions", &self.interactions)
            .finish_non_exhaustive()
    }
}

fn arg(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// A reply's `text` (empty when missing).
fn text_field(v: &Value) -> String {
    v.get("text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn strings(ready: &Map<String, Value>, key: &str) -> Vec<String> {
    ready
        .get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl PythonTools {
    /// Starts the host and loads the tools.
    pub fn start(settings: ToolSettings) -> Result<Self, ToolError> {
        let (host, ready) = Self::launch(&settings)?;
        Ok(PythonTools {
            settings,
            host,
            names: strings(&ready, "names"),
            interactions: strings(&ready, "interactions"),
            schemas: ready
                .get("schemas")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            next_id: 0,
            pending: BTreeMap::new(),
            answered: Vec::new(),
            batch: 0,
            tools_kwargs: Vec::new(),
            interaction_kwargs: Vec::new(),
        })
    }

    fn launch(
        settings: &ToolSettings,
    ) -> Result<(JsonLinesProcess, Map<String, Value>), ToolError> {
        let host_err = |what: &str| {
            let what = what.to_owned();
            move |source| ToolError::Host { what, source }
        };
        let args = [
            arg(&settings.tool_config),
            arg(&settings.function_tools),
            settings.call_timeout.as_secs_f64().to_string(),
            arg(&settings.interaction_config),
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
        Ok((host, ready))
    }

    /// The tools' OpenAI function schemas (what the chat template offers the model).
    pub fn schemas(&self) -> &[Value] {
        &self.schemas
    }

    /// The tools' names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The interactions' names.
    pub fn interactions(&self) -> &[String] {
        &self.interactions
    }

    /// Starts a batch whose sample `i` has the tool arguments `tools_kwargs[i]` and the
    /// interaction arguments `interaction_kwargs[i]`.
    pub fn begin_batch(
        &mut self,
        tools_kwargs: Vec<Map<String, Value>>,
        interaction_kwargs: Vec<Option<Map<String, Value>>>,
    ) {
        self.batch += 1;
        self.tools_kwargs = tools_kwargs;
        self.interaction_kwargs = interaction_kwargs;
    }

    fn create_kwargs(&self, sample: usize, tool: &str) -> Value {
        self.tools_kwargs
            .get(sample)
            .and_then(|k| k.get(tool))
            .and_then(|t| t.get("create_kwargs"))
            .cloned()
            .unwrap_or_else(|| json!({}))
    }

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
            for (sample, answer) in done {
                if let Answer::Tools(outcomes) = answer {
                    by_sample.insert(sample, outcomes);
                }
            }
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

    fn send(&mut self, sample: usize, mut request: Value, work: Work) {
        self.next_id += 1;
        let id = self.next_id;
        request["id"] = json!(id);
        // A host that is gone shows when its replies are awaited.
        let _ = self.host.send(&request);
        self.pending.insert(
            id,
            Pending {
                sample,
                deadline: Instant::now() + self.settings.call_timeout + HOST_GRACE,
                work,
            },
        );
    }

    /// Takes the host's answer `reply` for its pending request.
    fn take_reply(&mut self, reply: Map<String, Value>) -> Option<(usize, Answer)> {
        let id = reply.get("id").and_then(Value::as_u64)?;
        let p = self.pending.remove(&id)?;
        let results = reply.get("results").and_then(Value::as_array);
        let outcome = |i: usize, sent: usize, call: &FunctionCall| match results
            .filter(|a| a.len() == sent)
            .map(|a| &a[i])
        {
            Some(r) => ToolOutcome {
                text: text_field(r),
                reward: r.get("reward").and_then(Value::as_f64),
                failed: r.get("failed").and_then(Value::as_bool).unwrap_or(false),
            },
            None => tool_failed(&call.name, "the tool process answered out of protocol"),
        };
        let user = || {
            let user = reply.get("user");
            match (
                user,
                user.and_then(|u| u.get("error")).and_then(Value::as_str),
            ) {
                (_, Some(tb)) => Err(format!("the interaction failed:\n{}", tb.trim_end())),
                (Some(u), None) => Ok(UserReply {
                    text: text_field(u),
                    reward: u.get("reward").and_then(Value::as_f64),
                    terminate: u.get("terminate").and_then(Value::as_bool).unwrap_or(true),
                }),
                (None, None) => Err("the tool process answered out of protocol".into()),
            }
        };
        Some((p.sample, p.work.answer(outcome, user)))
    }

    /// Fails every pending request with `why`, and starts a fresh host for what comes next.
    fn restart(&mut self, why: &str) -> Vec<(usize, Answer)> {
        eprintln!("verlc: the tool process failed ({why}); restarting it");
        let failed = std::mem::take(&mut self.pending)
            .into_values()
            .map(|p| {
                let answer = p.work.answer(
                    |_, _, call| tool_failed(&call.name, why),
                    || Err(format!("the interaction failed: {why}")),
                );
                (p.sample, answer)
            })
            .collect();
        self.host.stop();
        match Self::launch(&self.settings) {
            Ok((host, _)) => self.host = host,
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
            self.answered.push((sample, Answer::Tools(outcomes)));
            return;
        }
        let request = json!({
            "calls": sent.iter().map(|&k| {
                let c = &calls[k];
                json!({"name": c.name, "arguments": c.arguments,
                       "create_kwargs": self.create_kwargs(sample, &c.name)})
            }).collect::<Vec<_>>(),
        });
        self.send(
            sample,
            request,
            Work::Calls {
                calls,
                outcomes,
                sent,
            },
        );
    }

    fn submit_reply(&mut self, sample: usize, messages: &[Message]) {
        let Some(kwargs) = self.interaction_kwargs.get(sample).cloned().flatten() else {
            self.answered.push((
                sample,
                Answer::User(Err(
                    "the sample has no `extra_info.interaction_kwargs` (verl needs them, with the interaction's `name`, when `interaction_config_path` is set)".into(),
                )),
            ));
            return;
        };
        let request = json!({
            "respond": {
                "instance": format!("verlc-{}-{sample}", self.batch),
                "messages": messages,
                "kwargs": kwargs,
            }
        });
        self.send(sample, request, Work::Reply);
    }

    fn finished(&mut self, wait: bool) -> Vec<(usize, Answer)> {
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
            let what = format!("running {} request(s)", self.pending.len());
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
