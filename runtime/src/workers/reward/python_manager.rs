//! A reward manager class run in Python as verl runs it (`manager_host.py`): the user's class
//! (`reward_manager.source: importlib`) or one of verl's registered managers verlc does not
//! implement itself. The manager gets the batch as a DataProto (prompts, responses, masks and
//! each row's sample fields) and returns a reward per response token; a row's score is the sum
//! of its rewards, as verl's metrics take it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value, json};
use verlc_spec::trainer::PythonManagerSpec;

use crate::pyproc::{JsonLinesProcess, ProcError};

use super::{RewardError, Score};

const SCRIPT: &str = concat!(
    include_str!("../../pyproc/verl_prelude.py"),
    include_str!("manager_host.py")
);

/// What the helper needs besides the spec.
#[derive(Debug, Clone)]
pub struct ManagerSettings {
    pub python: String,
    pub spec: PythonManagerSpec,
    /// A directory with the model's tokenizer files.
    pub tokenizer_dir: PathBuf,
    /// `custom_reward_function` (path, name, reward_kwargs); `None`: verl's
    /// `default_compute_score`.
    pub function: Option<(PathBuf, String, Map<String, Value>)>,
    pub startup_timeout: Duration,
    pub call_timeout: Duration,
}

/// A running manager.
#[derive(Debug)]
pub struct PythonManager {
    proc: JsonLinesProcess,
    next_id: u64,
    what: String,
    call_timeout: Duration,
    /// `legacy` (`manager(data, return_dict=True)`) or `loop` (`run_single` per row).
    pub interface: String,
    pub class: String,
    /// Where verl's base classes came from (see `pyproc/verl_prelude.py`).
    pub verl: String,
}

impl PythonManager {
    pub fn start(s: &ManagerSettings) -> Result<Self, RewardError> {
        let what = match &s.spec.class {
            Some(c) => format!("reward manager `{}` from {}", c.name, c.path),
            None => format!("verl's `{}` reward manager", s.spec.registered),
        };
        let fail = |msg: String| RewardError::Manager {
            what: what.clone(),
            msg,
        };
        if let Some(c) = &s.spec.class
            && !c.path.starts_with("pkg://")
            && !std::path::Path::new(&c.path).is_file()
        {
            return Err(fail(format!(
                "no such file: {} (reward_manager.module.path)",
                c.path
            )));
        }
        let arg = json!({
            "class": s.spec.class.as_ref().map(|c| json!({"path": c.path, "name": c.name})),
            "registered": s.spec.registered,
            "kwargs": s.spec.kwargs,
            "reward_fn_key": s.spec.reward_fn_key,
            "config": s.spec.config,
            "tokenizer": s.tokenizer_dir,
            "function": s.function.as_ref().map(|(p, n, k)| json!({"path": p, "name": n, "kwargs": k})),
        });
        let mut proc = JsonLinesProcess::spawn(&s.python, SCRIPT, &[arg.to_string()], "reward")
            .map_err(|e| fail(e.to_string()))?;
        let ready = proc
            .read(s.startup_timeout, "building the reward manager")
            .map_err(|e| fail(e.to_string()))?;
        if ready.get("ready") != Some(&Value::Bool(true)) {
            return Err(fail(text(&ready, "error")));
        }
        Ok(PythonManager {
            proc,
            next_id: 0,
            call_timeout: s.call_timeout,
            interface: text(&ready, "interface"),
            class: text(&ready, "class"),
            verl: text(&ready, "verl"),
            what,
        })
    }

    /// The rewards of a batch (`batch` as the helper's protocol says): per row its score (the
    /// sum of its token rewards), its token rewards and the manager's extra info.
    pub fn score(&mut self, batch: Value, rows: usize) -> Result<Vec<Score>, RewardError> {
        self.next_id += 1;
        let fail = |msg: String| RewardError::Manager {
            what: self.what.clone(),
            msg,
        };
        let reply = self
            .proc
            .request(
                &json!({"id": self.next_id, "batch": batch}),
                self.call_timeout,
                "scoring a batch",
            )
            .map_err(|e: ProcError| fail(e.to_string()))?;
        if reply.contains_key("error") {
            return Err(fail(text(&reply, "error")));
        }
        let rewards = reply
            .get("rewards")
            .and_then(Value::as_array)
            .ok_or_else(|| fail("its reply has no reward tensor".into()))?;
        if rewards.len() != rows {
            return Err(fail(format!(
                "it returned rewards for {} rows of a batch of {rows}",
                rewards.len()
            )));
        }
        let extra = reply.get("extra").and_then(Value::as_object);
        let mut out = Vec::with_capacity(rows);
        for (i, row) in rewards.iter().enumerate() {
            let tokens = row
                .as_array()
                .and_then(|r| r.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
                .ok_or_else(|| {
                    fail(format!(
                        "row {i} of its reward tensor is not a row of finite numbers: {}",
                        crate::workers::reward::clip(&row.to_string(), 200)
                    ))
                })?;
            let mut details = BTreeMap::new();
            for (k, v) in extra.into_iter().flatten() {
                if let Some(x) = v.as_array().and_then(|a| a.get(i)) {
                    details.insert(k.clone(), x.clone());
                }
            }
            out.push(Score {
                score: tokens.iter().sum(),
                extra: details,
                from_dict: false,
                tokens: Some(tokens),
            });
        }
        Ok(out)
    }
}

fn text(m: &Map<String, Value>, k: &str) -> String {
    m.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}
