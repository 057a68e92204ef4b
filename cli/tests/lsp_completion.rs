//! Drives the real yaml-language-server (npm, installed into tests/lsp by scripts/setup) over
//! LSP stdio and checks that completion, enum values, hovers and diagnostics come from the
//! committed schemas in `schemas/`: a full config and `optim/`, `engine/` and `ref/` group
//! files, each associated through a `# yaml-language-server: $schema=` modeline.
//!
//! The protocol details follow the server's behaviour (see reference notes): it pulls its
//! settings with `workspace/configuration` (the client must answer with the `yaml`
//! section), and it loads schemas asynchronously, so completion is asked only after the
//! first `textDocument/publishDiagnostics` for the document.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(20);

fn repo_root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// The server's JS entry point; the test fails (not skips) when it or node is missing.
fn server_entry() -> PathBuf {
    let entry =
        repo_root().join("tests/lsp/node_modules/yaml-language-server/bin/yaml-language-server");
    let node_ok = Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        node_ok,
        "`node` is not on PATH: the editor-completion test needs Node.js (>= 18) and yaml-language-server; run scripts/setup"
    );
    assert!(
        entry.is_file(),
        "yaml-language-server is not installed at {}: run scripts/setup (it runs `npm install` in tests/lsp)",
        entry.display()
    );
    entry
}

struct Server {
    child: Child,
    stdin: ChildStdin,
    rx: Receiver<Value>,
    next_id: i64,
    diagnostics: HashMap<String, Vec<Value>>,
    settings: Value,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Read one `Content-Length`-framed JSON-RPC message.
fn read_message(r: &mut impl BufRead) -> Option<Value> {
    let mut len = None;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse::<usize>().ok();
        }
    }
    let mut body = vec![0; len?];
    r.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

impl Server {
    fn start() -> Server {
        Server::start_with(&std::env::temp_dir(), json!({}))
    }

    /// A server whose workspace root is `root`, with `yaml.schemas` set to `schemas`.
    fn start_with(root: &Path, schemas: Value) -> Server {
        let entry = server_entry();
        let mut child = Command::new("node")
            .arg(&entry)
            .arg("--stdio")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start node {}: {e}; run scripts/setup",
                    entry.display()
                )
            });
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            while let Some(m) = read_message(&mut r) {
                if tx.send(m).is_err() {
                    break;
                }
            }
        });
        let settings = json!({
            "validate": true,
            "completion": true,
            "hover": true,
            "format": {"enable": false},
            "schemaStore": {"enable": false},
            "schemas": schemas
        });
        let mut s = Server {
            child,
            stdin,
            rx,
            next_id: 0,
            diagnostics: HashMap::new(),
            settings,
        };
        let root_uri = file_uri(root);
        s.request(
            "initialize",
            json!({
                "processId": std::process::id(),
                "rootUri": root_uri,
                "workspaceFolders": [{"uri": root_uri, "name": "verlc"}],
                "capabilities": {
                    "workspace": {"configuration": true, "didChangeConfiguration": {"dynamicRegistration": true}},
                    "textDocument": {
                        "completion": {"completionItem": {"snippetSupport": true, "documentationFormat": ["markdown", "plaintext"]}},
                        "hover": {"contentFormat": ["markdown", "plaintext"]},
                        "publishDiagnostics": {}
                    }
                }
            }),
        );
        s.notify("initialized", json!({}));
        // The server ignores this payload and asks back with workspace/configuration.
        s.notify(
            "workspace/didChangeConfiguration",
            json!({"settings": {"yaml": s.settings.clone()}}),
        );
        s
    }

    fn send(&mut self, msg: &Value) {
        let body = msg.to_string();
        let framed = format!("Content-Length: {}\r\n\r\n{body}", body.len());
        self.stdin
            .write_all(framed.as_bytes())
            .and_then(|_| self.stdin.flush())
            .expect("write to yaml-language-server");
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Handle one incoming message; returns it when it is a response.
    fn pump(&mut self, deadline: Instant, waiting_for: &str) -> Value {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = match self.rx.recv_timeout(left) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => panic!(
                "yaml-language-server: no answer within {TIMEOUT:?} while waiting for {waiting_for}"
            ),
            Err(RecvTimeoutError::Disconnected) => {
                panic!("yaml-language-server exited while waiting for {waiting_for}")
            }
        };
        match (m.get("method").and_then(Value::as_str), m.get("id")) {
            (Some("workspace/configuration"), Some(id)) => {
                let items = m["params"]["items"].as_array().cloned().unwrap_or_default();
                let result: Vec<Value> = items
                    .iter()
                    .map(|it| match it.get("section").and_then(Value::as_str) {
                        Some("yaml") => self.settings.clone(),
                        Some(_) => json!({}),
                        None => Value::Null,
                    })
                    .collect();
                let reply = json!({"jsonrpc": "2.0", "id": id.clone(), "result": result});
                self.send(&reply);
            }
            (Some(_), Some(id)) => {
                // client/registerCapability, window/workDoneProgress/create, ...
                let reply = json!({"jsonrpc": "2.0", "id": id.clone(), "result": Value::Null});
                self.send(&reply);
            }
            (Some("textDocument/publishDiagnostics"), None) => {
                let uri = m["params"]["uri"].as_str().unwrap_or("").to_string();
                let d = m["params"]["diagnostics"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                self.diagnostics.insert(uri, d);
            }
            _ => {}
        }
        m
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let m = self.pump(deadline, method);
            if m.get("method").is_none() && m.get("id") == Some(&json!(id)) {
                if let Some(e) = m.get("error") {
                    panic!("{method} failed: {e}");
                }
                return m.get("result").cloned().unwrap_or(Value::Null);
            }
        }
    }

    /// Open a document and wait until the server has validated it (schema loaded).
    fn open(&mut self, uri: &str, text: &str) -> Vec<Value> {
        self.diagnostics.remove(uri);
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": text}}),
        );
        let deadline = Instant::now() + TIMEOUT;
        while !self.diagnostics.contains_key(uri) {
            self.pump(deadline, "publishDiagnostics");
        }
        self.diagnostics.get(uri).cloned().unwrap_or_default()
    }

    fn completion(&mut self, uri: &str, line: usize, character: usize) -> Vec<Value> {
        let r = self.request("textDocument/completion", json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}));
        match r {
            Value::Array(items) => items,
            Value::Object(mut o) => match o.remove("items") {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    fn hover(&mut self, uri: &str, line: usize, character: usize) -> String {
        let r = self.request("textDocument/hover", json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}));
        match &r["contents"] {
            Value::String(s) => s.clone(),
            Value::Object(o) => o
                .get("value")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            other => other.to_string(),
        }
    }

    fn shutdown(mut self) {
        self.request("shutdown", Value::Null);
        self.notify("exit", Value::Null);
    }
}

fn file_uri(p: &Path) -> String {
    format!("file://{}", p.display())
}

/// Removes a test's scratch directory when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(dir_name: &str) -> Scratch {
        Scratch(temp_dir(dir_name))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir(parent); // only once empty, i.e. by the last test
        }
    }
}

fn temp_dir(dir_name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("verlc-lsp-{}", std::process::id()))
        .join(dir_name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A document on disk (the modeline's relative-path rules need a real location) under a
/// per-process temporary directory, associated to `schema` by a modeline.
fn write_doc(dir_name: &str, file: &str, body: &str, schema: &str) -> (String, String) {
    let dir = temp_dir(dir_name);
    let schema_path = repo_root().join("schemas").join(schema);
    assert!(
        schema_path.is_file(),
        "{} is missing: run `verlc schema -o schemas`",
        schema_path.display()
    );
    let text = format!(
        "# yaml-language-server: $schema={}\n{body}",
        schema_path.display()
    );
    let path = dir.join(file);
    std::fs::write(&path, &text).expect("write doc");
    (file_uri(&path), text)
}

/// (line, character) just after the first occurrence of `needle` in `text`.
fn pos_after(text: &str, needle: &str) -> (usize, usize) {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` not in the document"))
        + needle.len();
    let line = text[..at].matches('\n').count();
    let col = at - text[..at].rfind('\n').map_or(0, |i| i + 1);
    (line, col)
}

fn labels(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .filter_map(|i| i["label"].as_str().map(String::from))
        .collect()
}

fn documentation(items: &[Value], label: &str) -> String {
    let item = items
        .iter()
        .find(|i| i["label"] == label)
        .cloned()
        .unwrap_or(Value::Null);
    match &item["documentation"] {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("value")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        _ => String::new(),
    }
}

fn errors(diags: &[Value]) -> Vec<String> {
    diags
        .iter()
        .filter(|d| d["severity"] == 1)
        .map(|d| format!("line {}: {}", d["range"]["start"]["line"], d["message"]))
        .collect()
}

fn assert_has(got: &[String], want: &[&str], what: &str) {
    let missing: Vec<&&str> = want
        .iter()
        .filter(|w| !got.iter().any(|g| g == *w))
        .collect();
    assert!(missing.is_empty(), "{what}: missing {missing:?} in {got:?}");
}

#[test]
fn full_config_completes_keys_and_enum_values_from_the_root_schema() {
    let _scratch = Scratch::new("full");
    let mut s = Server::start();
    let body = "actor_rollout_ref:\n  actor:\n    strategy: fsdp\n    loss_agg_mode: \n    \n  rollout:\n    name: vllm\ndata:\n  train_batch_size: 1024\n";
    let (uri, text) = write_doc("full", "config.yaml", body, "verl.schema.json");
    s.open(&uri, &text);

    // Keys of actor_rollout_ref.actor on the empty line below `loss_agg_mode:`.
    let (line, _) = pos_after(&text, "loss_agg_mode: \n");
    let keys = labels(&s.completion(&uri, line, 4));
    assert_has(
        &keys,
        &[
            "ppo_mini_batch_size",
            "optim",
            "ppo_micro_batch_size_per_gpu",
            "clip_ratio",
            "use_kl_loss",
            "fsdp_config",
        ],
        "actor keys",
    );
    assert!(
        !keys.iter().any(|k| k == "strategy"),
        "a key already present was offered: {keys:?}"
    );
    assert!(
        !keys.iter().any(|k| k == "ppo_micro_batch_size"),
        "a deprecated key was offered: {keys:?}"
    );
    assert!(
        !keys.iter().any(|k| k == "train_batch_size"),
        "a key of another section was offered: {keys:?}"
    );

    // Enum values after `loss_agg_mode: `, with the schema's descriptions.
    let (line, col) = pos_after(&text, "loss_agg_mode: ");
    let items = s.completion(&uri, line, col);
    let mut values = labels(&items);
    values.sort();
    assert_eq!(
        values,
        [
            "seq-mean-token-mean",
            "seq-mean-token-sum",
            "seq-mean-token-sum-norm",
            "token-mean",
            "token-sum"
        ],
        "loss_agg_mode values"
    );
    assert!(
        documentation(&items, "token-mean").contains("every valid token"),
        "no enum description: {items:?}"
    );

    // Hover shows the doc comment of the key.
    let (line, col) = pos_after(&text, "    strat");
    let hover = s.hover(&uri, line, col);
    assert!(hover.contains("Training backend"), "hover: {hover}");

    // Validation uses the schema too: typos and bad enum values are errors,
    // interpolations and `???` are not.
    let bad = "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_sise: 8\n    loss_agg_mode: token_mean\n    ppo_epochs: ${trainer.total_epochs}\n  rollout:\n    name: ???\n";
    let (uri2, text2) = write_doc("full", "bad.yaml", bad, "verl.schema.json");
    let errs = errors(&s.open(&uri2, &text2));
    assert!(
        errs.iter().any(|e| e.contains("ppo_mini_batch_sise")),
        "no unknown-key error: {errs:?}"
    );
    assert!(
        errs.iter().any(|e| e.contains("token-mean")),
        "no enum error listing the values: {errs:?}"
    );
    assert_eq!(errs.len(), 2, "unexpected errors: {errs:?}");
    s.shutdown();
}

#[test]
fn optim_and_engine_group_files_complete_from_their_schemas() {
    let (_optim, _engine) = (Scratch::new("optim"), Scratch::new("engine"));
    let mut s = Server::start();
    let body = "weight_decay: 0.0\nlr_scheduler_type: \n\n";
    let (uri, text) = write_doc("optim", "my_optim.yaml", body, "optim.schema.json");
    s.open(&uri, &text);
    let (line, _) = pos_after(&text, "lr_scheduler_type: \n");
    let keys = labels(&s.completion(&uri, line, 0));
    // FSDP keys and Megatron keys: one schema serves both kinds of optim file.
    assert_has(
        &keys,
        &[
            "lr",
            "lr_warmup_steps_ratio",
            "betas",
            "clip_grad",
            "lr_decay_style",
            "min_lr",
            "weight_decay_incr_style",
        ],
        "optim keys",
    );
    assert!(
        !keys
            .iter()
            .any(|k| k == "weight_decay" || k == "warmup_style"),
        "present or deprecated key offered: {keys:?}"
    );
    let (line, col) = pos_after(&text, "lr_scheduler_type: ");
    let values = labels(&s.completion(&uri, line, col));
    assert_has(&values, &["constant", "cosine"], "lr_scheduler_type values");
    assert!(
        values
            .iter()
            .all(|v| ["constant", "cosine", "null"].contains(&v.as_str())),
        "lr_scheduler_type values: {values:?}"
    );

    // verlc's built-in optim and engine files of both backends validate without errors.
    for (schema, rel) in [
        ("optim", "optim/fsdp.yaml"),
        ("optim", "optim/megatron.yaml"),
        ("engine", "engine/fsdp.yaml"),
        ("engine", "engine/megatron.yaml"),
    ] {
        let body = std::fs::read_to_string(repo_root().join("front/defaults").join(rel))
            .expect("built-in file");
        let (uri, text) = write_doc(
            schema,
            &rel.replace('/', "_"),
            &body,
            &format!("{schema}.schema.json"),
        );
        let errs = errors(&s.open(&uri, &text));
        assert!(errs.is_empty(), "{rel}: {errs:?}");
    }

    // Engine values of both backends complete from the union schema.
    let (uri, text) = write_doc(
        "engine",
        "my_engine.yaml",
        "strategy: \n",
        "engine.schema.json",
    );
    s.open(&uri, &text);
    let (line, col) = pos_after(&text, "strategy: ");
    assert_has(
        &labels(&s.completion(&uri, line, col)),
        &["fsdp", "fsdp2", "megatron"],
        "engine strategy values",
    );
    s.shutdown();
}

#[test]
fn ref_group_file_completes_from_its_schema() {
    let _scratch = Scratch::new("ref");
    let mut s = Server::start();
    let body = "defaults:\n  - ref\n  - ../engine@fsdp_config: fsdp\n  - _self_\nstrategy: ${actor_rollout_ref.actor.strategy}\nlog_prob_use_dynamic_bsz: \nrouter_replay:\n  mode: \n\n";
    let (uri, text) = write_doc("ref", "my_ref.yaml", body, "ref.schema.json");
    let diags = s.open(&uri, &text);
    // The defaults list and the interpolation are accepted; only the two empty values are
    // flagged (an empty value is null).
    let errs = errors(&diags);
    assert!(
        errs.iter()
            .all(|e| e.starts_with("line 6") || e.starts_with("line 8")),
        "{errs:?}"
    );

    let (line, _) = pos_after(&text, "  mode: \n");
    let keys = labels(&s.completion(&uri, line, 0));
    assert_has(
        &keys,
        &[
            "log_prob_micro_batch_size_per_gpu",
            "log_prob_max_token_len_per_gpu",
            "fsdp_config",
            "megatron",
            "rollout_n",
        ],
        "ref keys",
    );
    assert!(
        !keys.iter().any(|k| k == "log_prob_micro_batch_size"),
        "deprecated key offered: {keys:?}"
    );

    let (line, col) = pos_after(&text, "log_prob_use_dynamic_bsz: ");
    assert_has(
        &labels(&s.completion(&uri, line, col)),
        &["true", "false"],
        "boolean values",
    );
    let (line, col) = pos_after(&text, "  mode: ");
    let modes = labels(&s.completion(&uri, line, col));
    assert_has(&modes, &["disabled"], "router_replay.mode values");
    assert!(modes.len() >= 2, "router_replay.mode values: {modes:?}");
    s.shutdown();
}

/// The `yaml.schemas` setting (VS Code, Neovim...): schema paths relative to the workspace
/// root, mapped to files by glob, no modeline in the files.
#[test]
fn yaml_schemas_setting_maps_group_directories_to_schemas() {
    let _scratch = Scratch::new("settings");
    let root = repo_root();
    let mut s = Server::start_with(
        &root,
        json!({
            "./schemas/optim.schema.json": ["**/optim/*.yaml"],
            "./schemas/ref.schema.json": ["**/ref/*.yaml"],
            "./schemas/verl.schema.json": ["**/verl-conf/*.yaml"]
        }),
    );
    let cases = [
        (
            "optim",
            "lr_scheduler_type: \n",
            "lr_scheduler_type: ",
            &["constant", "cosine"][..],
        ),
        (
            "ref",
            "router_replay:\n  mode: \n",
            "mode: ",
            &["disabled"][..],
        ),
        (
            "verl-conf",
            "algorithm:\n  adv_estimator: \n",
            "adv_estimator: ",
            &["gae", "grpo"][..],
        ),
    ];
    for (dir, body, after, want) in cases {
        let path = temp_dir(&format!("settings/{dir}")).join("mine.yaml");
        std::fs::write(&path, body).expect("write doc");
        let uri = file_uri(&path);
        s.open(&uri, body);
        let (line, col) = pos_after(body, after);
        assert_has(
            &labels(&s.completion(&uri, line, col)),
            want,
            &format!("{dir}/mine.yaml via yaml.schemas"),
        );
    }
    s.shutdown();
}
