//! Loggers: verl's console line, the JSONL file logger, TensorBoard event files (checked
//! against a file written by the `tensorboard` package, read back by our reader and, when a
//! python with `tensorboard` is available, by TensorBoard's own loader), and the start-up
//! error for unsupported backends.

use std::process::Command;

use runtime::engine::Metrics;
use runtime::logging::tensorboard::{
    TensorboardLogger, crc32c, encode_event, frame, masked_crc32c, read_events,
};
use runtime::logging::{FileLogger, Logger, console_line};

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
        Some(runtime::workers::reward::PythonSettings::default_python()),
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
        eprintln!(
            "skipping the TensorBoard loader check: no python with `tensorboard` (set VERLC_TB_PYTHON)"
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
    // wandb, swanlab, mlflow, clearml: `verlc build` refuses them (B018 at trainer.logger), so
    // no spec, and no start-up refusal, exists for them.
    for b in ["wandb", "swanlab", "mlflow", "clearml"] {
        let req = verlc::load::compose::LoadRequest {
            config_file: Some(crate::support::repo().join("examples/quickstart.yaml")),
            overrides: vec![format!("trainer.logger=[console,{b}]")],
            cwd: crate::support::repo(),
            ..Default::default()
        };
        match verlc::plan::lower_request(&req) {
            verlc::plan::SpecOutcome::Errors(checked) => {
                let d = checked
                    .diagnostics
                    .iter()
                    .find(|d| d.code.0 == "B018")
                    .expect("B018");
                assert_eq!(d.key_path.as_deref(), Some("trainer.logger"));
                assert!(d.primary.is_some(), "no YAML line");
                assert!(d.message.contains(b), "{}", d.message);
            }
            verlc::plan::SpecOutcome::Ok { .. } => panic!("logger {b} lowered to a spec"),
        }
    }
}
