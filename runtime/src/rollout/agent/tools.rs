//! The tools of `rollout.multi_turn` in a Python helper process (`tool_host.py`, the protocol
//! at its top): verl's BaseTool classes from `tool_config_path` and `@function_tool` functions
//! from `function_tool_path`. A round's calls run concurrently in the host. A call that raises
//! gets verl's error text (the model sees it); a host that crashes or hangs past the timeout is
//! restarted, and the round's calls get `Error executing tool '<name>': ...` saying so, so one
//! bad tool call ends neither the trajectory's batch nor the run.

use std::path::PathBuf;
use std::time::Duration;

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
    /// Longest wait for one round of calls.
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
    /// Per sample: `tools_kwargs` (`{tool: {"create_kwargs": {...}}}`), set per batch.
    pub tools_kwargs: Vec<Map<String, Value>>,
}

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
        let args = [arg(&settings.tool_config), arg(&settings.function_tools)];
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

impl ToolRunner for PythonTools {
    fn run(&mut self, calls: &[(usize, FunctionCall)]) -> Vec<ToolOutcome> {
        // Unknown names are answered here, as verl's loop does, without the host.
        let known: Vec<usize> = (0..calls.len())
            .filter(|&i| self.names.contains(&calls[i].1.name))
            .collect();
        let mut out: Vec<ToolOutcome> = calls
            .iter()
            .map(|(_, c)| unknown_tool(&c.name, &self.names))
            .collect();
        if known.is_empty() {
            return out;
        }
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({
            "id": id,
            "calls": known.iter().map(|&i| {
                let (sample, c) = &calls[i];
                json!({"name": c.name, "arguments": c.arguments,
                       "create_kwargs": self.create_kwargs(*sample, &c.name)})
            }).collect::<Vec<_>>(),
        });
        let what = format!("running {} tool call(s)", known.len());
        let reply = self
            .host
            .request(&request, self.settings.call_timeout, &what);
        let results = match reply {
            Ok(r) => r
                .get("id")
                .and_then(Value::as_u64)
                .filter(|&got| got == id)
                .and_then(|_| r.get("results").and_then(Value::as_array).cloned())
                .filter(|a| a.len() == known.len())
                .ok_or_else(|| "it answered out of protocol".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        match results {
            Ok(results) => {
                for (&i, r) in known.iter().zip(results) {
                    out[i] = ToolOutcome {
                        text: r
                            .get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        reward: r.get("reward").and_then(Value::as_f64),
                    };
                }
            }
            Err(why) => {
                // The host crashed, hung or answered nonsense: the round's calls failed, and
                // a fresh host serves the next round.
                eprintln!("verlc: the tool process failed ({why}); restarting it");
                for &i in &known {
                    out[i] = tool_failed(&calls[i].1.name, &why);
                }
                self.host.stop();
                match Self::launch(&self.settings) {
                    Ok((host, _, _)) => self.host = host,
                    Err(e) => eprintln!("verlc: the tool process did not restart: {e}"),
                }
            }
        }
        out
    }
}
