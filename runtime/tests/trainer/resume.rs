//! kill -9 during training, then resume: training continues from the last complete
//! checkpoint, no checkpoint is ever half-written, and the resumed run's metrics equal an
//! uninterrupted run's exactly.
//!
//! The runs are child processes (this test binary re-executed with `RESUME_CHILD_DIR` set,
//! running only `resume_child`), so the kill is a real SIGKILL of a training process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use verlc_runtime::trainer::checkpoint::{list_steps, read_tracker, step_dir};

use crate::support::{is_timing, quiet, scratch, small_grpo};

const CHILD_ENV: &str = "RESUME_CHILD_DIR";
// Enough steps that the child is still training when the first checkpoint appears: after the
// step-2 checkpoint, 14 more steps with checkpoints and validations (seconds on one thread)
// against a poll every 20 ms.
const STEPS: u64 = 16;

fn config(dir: &Path) -> verlc_spec::TrainerSpec {
    small_grpo(
        dir,
        STEPS,
        &[
            "trainer.save_freq=2",
            "trainer.logger=[file]",
            "trainer.val_before_train=true",
            "trainer.test_freq=3",
            "data.val_max_samples=8",
            "algorithm.use_kl_in_reward=true",
            "algorithm.kl_ctrl.type=adaptive",
        ],
    )
}

/// The child: trains the config in `$RESUME_CHILD_DIR` (resume_mode auto).
#[test]
fn resume_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    tch::set_num_threads(1);
    let dir = PathBuf::from(dir);
    verlc_runtime::trainer::run(&config(&dir), &quiet()).expect("child run");
}

fn spawn(dir: &Path) -> Child {
    let exe = std::env::current_exe().expect("test binary");
    Command::new(exe)
        .args([
            "resume::resume_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .env("VERL_FILE_LOGGER_PATH", dir.join("metrics.jsonl"))
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child")
}

fn wait(mut c: Child) {
    let status = c.wait().expect("wait");
    assert!(status.success(), "child failed: {status}");
}

/// Step -> training metrics (timing excluded) of a JSONL log; the validation-only line of a
/// step is merged into it.
fn read_log(path: &Path) -> Vec<(u64, serde_json::Map<String, Value>)> {
    let text = std::fs::read_to_string(path).expect("metrics log");
    let mut out: Vec<(u64, serde_json::Map<String, Value>)> = Vec::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("json line");
        let step = v["step"].as_u64().expect("step");
        let data: serde_json::Map<String, Value> = v["data"]
            .as_object()
            .expect("data")
            .iter()
            .filter(|(k, _)| !is_timing(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.push((step, data));
    }
    out
}

/// Every visible checkpoint is complete.
fn assert_complete(root: &Path) {
    for s in list_steps(root) {
        let d = step_dir(root, s);
        for f in [
            "data.json",
            "actor/optim.safetensors",
            "actor/huggingface/model.safetensors",
            "actor/huggingface/config.json",
        ] {
            assert!(
                d.join(f).is_file(),
                "checkpoint {} is missing {f}",
                d.display()
            );
        }
    }
    if let Some(t) = read_tracker(root).expect("tracker") {
        assert!(
            step_dir(root, t).is_dir(),
            "the tracker names a missing checkpoint"
        );
    }
}

#[test]
fn kill_9_then_resume_matches_an_uninterrupted_run() {
    let base = scratch("resume");
    let (a, b) = (base.join("uninterrupted"), base.join("killed"));
    std::fs::create_dir_all(&a).expect("dir");
    std::fs::create_dir_all(&b).expect("dir");
    let reference = spawn(&a);
    let mut victim = spawn(&b);
    let root = b.join("ckpt");
    let start = Instant::now();
    // Kill as soon as the first checkpoint is complete (the child is then mid-step 3).
    loop {
        if read_tracker(&root).ok().flatten().is_some_and(|s| s >= 2) {
            break;
        }
        assert!(
            victim.try_wait().expect("poll").is_none(),
            "the child finished before it could be killed"
        );
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "no checkpoint appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    victim.kill().expect("SIGKILL");
    let _ = victim.wait();
    assert_complete(&root);
    let resumed_from = read_tracker(&root).expect("tracker").expect("a checkpoint");
    assert!(resumed_from < STEPS, "killed before the end");

    wait(spawn(&b));
    wait(reference);
    assert_complete(&root);
    assert_eq!(read_tracker(&root).expect("tracker"), Some(STEPS));

    let (la, lb) = (
        read_log(&a.join("metrics.jsonl")),
        read_log(&b.join("metrics.jsonl")),
    );
    let train = |log: &[(u64, serde_json::Map<String, Value>)]| -> Vec<(u64, serde_json::Map<String, Value>)> {
        log.iter().filter(|(_, d)| d.contains_key("training/global_step")).cloned().collect()
    };
    let (ta, tb) = (train(&la), train(&lb));
    assert_eq!(ta.len() as u64, STEPS);
    assert_eq!(
        tb.len() as u64,
        STEPS,
        "each step logged once: {:?}",
        tb.iter().map(|(s, _)| s).collect::<Vec<_>>()
    );
    for ((sa, da), (sb, db)) in ta.iter().zip(&tb) {
        assert_eq!(sa, sb);
        assert_eq!(
            da.keys().collect::<Vec<_>>(),
            db.keys().collect::<Vec<_>>(),
            "step {sa}"
        );
        for (k, va) in da {
            assert_eq!(
                Some(va),
                db.get(k),
                "step {sa}: {k} differs after resume from step {resumed_from}"
            );
        }
    }
    // The validation after resuming (val_before_train) scores the restored policy exactly as
    // the uninterrupted run scored it at that step.
    let val_at = |log: &[(u64, serde_json::Map<String, Value>)], s: u64| -> Option<Value> {
        log.iter().filter(|(st, _)| *st == s).find_map(|(_, d)| {
            d.iter()
                .find(|(k, _)| k.starts_with("val-core/"))
                .map(|(_, v)| v.clone())
        })
    };
    assert_eq!(val_at(&la, STEPS), val_at(&lb, STEPS));
}
