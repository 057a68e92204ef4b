//! Loggers: verl's console line, the JSONL file logger, TensorBoard event files (checked
//! against a file written by the `tensorboard` package, read back by our reader and, when a
//! python with `tensorboard` is available, by TensorBoard's own loader), wandb (offline) and
//! MLflow (local file store) through their SDKs, read back with their own schema and client,
//! and the build-time error for unsupported backends.

use std::process::Command;

use verlc_runtime::engine::Metrics;
use verlc_runtime::logging::tensorboard::{
    TensorboardLogger, crc32c, encode_event, frame, masked_crc32c, read_events,
};
use verlc_runtime::logging::{FileLogger, Logger, Tracking, TrackingOptions, console_line};
use verlc_spec::trainer::LoggerKind;

use crate::support::{repo, scratch};

fn metrics(pairs: &[(&str, f64)]) -> Metrics {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn console_line_is_verls_format() {
    let m = metrics(&[("critic/score/mean", 0.5), ("actor/pg_loss", -0.01234)]);
    assert_eq!(
        console_line(3, &m),
        "step:3 - actor/pg_loss:-0.012 - critic/score/mean:0.500"
    );
}

#[test]
fn crc32c_and_tfrecord_match_a_file_written_by_tensorboard() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283, "the CRC-32C check value");
    assert_eq!(crc32c(b""), 0);
    let known = std::fs::read(repo().join("runtime/tests/trainer/fixtures/known_good.tfevents"))
        .expect("fixture");
    let mut ours = frame(&encode_event(
        1_700_000_000.25,
        0,
        Some("brain.Event:2"),
        &[],
    ));
    ours.extend(frame(&encode_event(
        1_700_000_001.5,
        3,
        None,
        &[("actor/pg_loss", -0.125), ("critic/score/mean", 0.75)],
    )));
    assert_eq!(
        ours, known,
        "byte-identical to tensorboard's RecordWriter + Event protobuf"
    );
    let events = read_events(&repo().join("runtime/tests/trainer/fixtures/known_good.tfevents"))
        .expect("reads");
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    assert_eq!(events[1].step, 3);
    assert_eq!(
        events[1].scalars,
        vec![
            ("actor/pg_loss".to_string(), -0.125),
            ("critic/score/mean".to_string(), 0.75)
        ]
    );
    let _ = masked_crc32c(b"");
}

/// A python that can import tensorboard: `$VERLC_TB_PYTHON`, or the default interpreter.
fn tensorboard_python() -> Option<String> {
    let candidates = [
        std::env::var("VERLC_TB_PYTHON").ok(),
        Some(verlc_runtime::workers::reward::PythonSettings::default_python()),
    ];
    candidates.into_iter().flatten().find(|p| {
        Command::new(p)
            .args(["-c", "import tensorboard"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn tensorboard_reads_our_event_files() {
    let dir = scratch("tb_events");
    let mut logger = TensorboardLogger::create(&dir).expect("create");
    for step in 1..=3u64 {
        logger
            .log(
                step,
                &metrics(&[("critic/score/mean", step as f64 / 4.0), ("actor/lr", 1e-3)]),
            )
            .expect("log");
    }
    let path = logger.path().to_path_buf();
    drop(logger);
    assert!(
        path.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("events.out.tfevents."))
    );
    let events = read_events(&path).expect("our reader");
    assert_eq!(events.len(), 4);
    assert_eq!(events[3].step, 3);
    assert!(
        events[3]
            .scalars
            .contains(&("critic/score/mean".to_string(), 0.75))
    );

    let Some(python) = tensorboard_python() else {
        verlc_testkit::missing_data(
            "no python with `tensorboard` for the loader check (scripts/setup installs it in .venv; or set VERLC_TB_PYTHON)",
        );
        return;
    };
    let script = r#"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1])
acc.Reload()
for e in acc.Scalars("critic/score/mean"):
    print(e.step, e.value)
print("tags", sorted(acc.Tags()["scalars"]))
"#;
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(&dir)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 0.25\n2 0.5\n3 0.75\n"), "{text}");
    assert!(
        text.contains("tags ['actor/lr', 'critic/score/mean']"),
        "{text}"
    );
}

#[test]
fn file_logger_writes_verls_jsonl_and_keeps_history_on_resume() {
    let dir = scratch("file_logger");
    let path = dir.join("proj/exp.jsonl");
    let mut l = FileLogger::open(&path, None).expect("open");
    for s in 1..=4 {
        l.log(s, &metrics(&[("x", s as f64), ("nan", f64::NAN)]))
            .expect("log");
    }
    drop(l);
    let text = std::fs::read_to_string(&path).expect("read");
    let first = text.lines().next().expect("a line");
    assert_eq!(first, r#"{"step":1,"data":{"nan":null,"x":1.0}}"#);
    // Resuming after step 2 drops the lines an interrupted run wrote after its checkpoint.
    let mut l = FileLogger::open(&path, Some(2)).expect("reopen");
    l.log(3, &metrics(&[("x", 30.0)])).expect("log");
    drop(l);
    let steps: Vec<String> = std::fs::read_to_string(&path)
        .expect("read")
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(steps.len(), 3);
    assert!(steps[2].contains("30.0"));
    assert!(
        FileLogger::default_path("p", "e")
            .to_string_lossy()
            .ends_with(".jsonl")
            || std::env::var("VERL_FILE_LOGGER_PATH").is_ok()
    );
}

#[test]
fn unsupported_backends_never_reach_the_trainer() {
    // swanlab, clearml: `verlc build` refuses them (B018 at trainer.logger), so no spec, and no
    // start-up refusal, exists for them.
    for b in ["swanlab", "clearml"] {
        let req = verlc_front::load::compose::LoadRequest {
            config_file: Some(crate::support::repo().join("examples/quickstart.yaml")),
            overrides: vec![format!("trainer.logger=[console,{b}]")],
            cwd: crate::support::repo(),
            builtin: verlc_front::load::version::BuiltinRelease::V0_7_0,
            ..Default::default()
        };
        match verlc_front::compile::lower_request(&req) {
            verlc_front::compile::SpecOutcome::Errors(checked) => {
                let d = checked
                    .diagnostics
                    .iter()
                    .find(|d| d.code.0 == "B018")
                    .expect("B018");
                assert_eq!(d.key_path.as_deref(), Some("trainer.logger"));
                assert!(d.primary.is_some(), "no YAML line");
                assert!(d.message.contains(b), "{}", d.message);
            }
            verlc_front::compile::SpecOutcome::Ok { .. } => panic!("logger {b} lowered to a spec"),
        }
    }
}

fn venv_python() -> String {
    repo().join(".venv/bin/python").display().to_string()
}

/// What a Python reader printed (it must succeed).
fn python_stdout(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tracking(kind: LoggerKind, env: Vec<(String, String)>) -> Tracking {
    Tracking::new(
        &[kind],
        &TrackingOptions {
            project: "verlc_tests".into(),
            experiment: "tracker".into(),
            total_steps: 3,
            resume_from_step: None,
            console_lines: false,
            config: serde_json::json!({"algorithm": {"adv_estimator": "grpo"}, "lr": 0.001}),
            python: venv_python(),
            tracker_env: env,
        },
    )
    .unwrap()
}

fn three_steps(t: &mut Tracking) {
    for step in 1..=3u64 {
        let m = metrics(&[
            ("critic/score/mean", 0.25 * step as f64),
            ("actor/pg_loss", -0.01 * step as f64),
            ("val-core/digits/acc@1", 0.5),
        ]);
        t.log(step, &m).unwrap();
    }
    t.finish();
}

/// MLflow with a local file store, read back with MLflow's own client: verl's metric names
/// (`@` as `_at_`), steps and values, the experiment and run names, the config as params.
#[test]
fn mlflow_records_what_mlflows_client_reads_back() {
    let dir = scratch("mlflow");
    let uri = format!("file:{}", dir.join("mlruns").display());
    // MLflow 3 keeps its file store behind this switch (verl's default is a SQLite file).
    let mut t = tracking(
        LoggerKind::Mlflow,
        vec![
            ("MLFLOW_TRACKING_URI".into(), uri.clone()),
            ("MLFLOW_ALLOW_FILE_STORE".into(), "true".into()),
        ],
    );
    three_steps(&mut t);
    let script = r#"
import json, sys
from mlflow.tracking import MlflowClient
c = MlflowClient(tracking_uri=sys.argv[1])
exp = c.get_experiment_by_name("verlc_tests")
run = c.search_runs([exp.experiment_id])[0]
hist = {k: [(m.step, m.value) for m in c.get_metric_history(run.info.run_id, k)]
        for k in ["critic/score/mean", "actor/pg_loss", "val-core/digits/acc_at_1"]}
print(json.dumps({"name": run.info.run_name, "params": run.data.params, "hist": hist,
                  "status": run.info.status}))
"#;
    let text = python_stdout(
        Command::new(venv_python())
            .args(["-c", script, &uri])
            .env("MLFLOW_ALLOW_FILE_STORE", "true"),
    );
    let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(v["name"], "tracker");
    assert_eq!(v["status"], "FINISHED");
    assert_eq!(v["params"]["algorithm/adv_estimator"], "grpo");
    let hist = &v["hist"]["critic/score/mean"];
    let got: Vec<(u64, f64)> = hist
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
        .collect();
    assert_eq!(got, vec![(1, 0.25), (2, 0.5), (3, 0.75)]);
    assert_eq!(
        v["hist"]["val-core/digits/acc_at_1"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(v["hist"]["actor/pg_loss"][2][1].as_f64(), Some(-0.03));
}

/// Reads an offline wandb run's transaction log (`run-*.wandb`): LevelDB-style framed records
/// (wandb 0.31 ships no Python reader for them), each decoded with wandb's own protobuf schema
/// (`wandb.proto.wandb_internal_pb2.Record`). Prints the run record, then the history rows.
const WANDB_READER: &str = r#"
import json, struct, sys
from wandb.proto import wandb_internal_pb2

def records(path):
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        buf += chunk
        if kind in (1, 4):
            yield buf
            buf = b""

rows = []
for raw in records(sys.argv[1]):
    rec = wandb_internal_pb2.Record()
    rec.ParseFromString(raw)
    if rec.WhichOneof("record_type") == "history":
        rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
    if rec.WhichOneof("record_type") == "run":
        cfg = {u.key: json.loads(u.value_json) for u in rec.run.config.update}
        print(json.dumps({"run": rec.run.display_name, "project": rec.run.project, "config_keys": sorted(cfg)}))
print(json.dumps(rows))
"#;

/// wandb in offline mode: the run's transaction log holds the project, run name and config,
/// and one history row per step with verl's metric names and values.
#[test]
fn wandb_offline_run_records_the_history() {
    let dir = scratch("wandb");
    let mut t = tracking(
        LoggerKind::Wandb,
        vec![
            ("WANDB_MODE".into(), "offline".into()),
            ("WANDB_DIR".into(), dir.display().to_string()),
            ("WANDB_SILENT".into(), "true".into()),
        ],
    );
    three_steps(&mut t);
    let runs: Vec<_> = std::fs::read_dir(dir.join("wandb"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("offline-run-"))
        .collect();
    assert_eq!(runs.len(), 1, "one offline run");
    let log = std::fs::read_dir(runs[0].path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "wandb"))
        .expect("run-*.wandb");
    let text = python_stdout(
        Command::new(venv_python())
            .args(["-c", WANDB_READER])
            .arg(&log),
    );
    let lines: Vec<&str> = text.lines().collect();
    let run: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(run["run"], "tracker");
    assert_eq!(run["project"], "verlc_tests");
    assert!(
        run["config_keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == "algorithm")
    );
    let rows: serde_json::Value = serde_json::from_str(lines[lines.len() - 1]).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for (i, row) in rows.iter().enumerate() {
        let step = i as f64 + 1.0;
        assert_eq!(row["_step"].as_f64(), Some(step));
        assert_eq!(row["critic/score/mean"].as_f64(), Some(0.25 * step));
        assert_eq!(row["val-core/digits/acc@1"].as_f64(), Some(0.5));
    }
}

/// A tracker that cannot start or fails never stops training.
#[test]
fn a_broken_tracker_never_stops_training() {
    let dir = scratch("broken-tracker");
    // No interpreter at all.
    let mut t = Tracking::new(
        &[LoggerKind::Mlflow],
        &TrackingOptions {
            project: "p".into(),
            experiment: "e".into(),
            total_steps: 3,
            resume_from_step: None,
            console_lines: false,
            config: serde_json::json!({}),
            python: dir.join("no-such-python").display().to_string(),
            tracker_env: Vec::new(),
        },
    )
    .unwrap();
    three_steps(&mut t);
    // An SDK that fails at start (an unusable tracking URI).
    let mut t = tracking(
        LoggerKind::Mlflow,
        vec![("MLFLOW_TRACKING_URI".into(), "nosuchscheme://x".into())],
    );
    three_steps(&mut t);
}
