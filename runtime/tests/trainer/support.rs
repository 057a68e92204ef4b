//! Specs (an example plus overrides, lowered as `verlc build` does) and scratch dirs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use verlc_front::compile::{SpecOutcome, lower_request};
use verlc_front::load::compose::LoadRequest;
use verlc_front::load::version::BuiltinRelease;
use verlc_runtime::engine::Metrics;
use verlc_runtime::trainer::RunOptions;
use verlc_spec::TrainerSpec;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fresh scratch directory under the target dir.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("trainer_tests")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The trainer spec of `examples/<example>` with `overrides`, lowered as `verlc build` does on
/// verl 0.7.0's tree.
pub fn spec_of(example: &str, overrides: &[String]) -> TrainerSpec {
    spec_on(example, overrides, BuiltinRelease::V0_7_0)
}

/// [`spec_of`] on the built-in tree of `release` (a feature of a later release).
pub fn spec_on(example: &str, overrides: &[String], release: BuiltinRelease) -> TrainerSpec {
    let req = LoadRequest {
        config_file: Some(repo().join("examples").join(example)),
        overrides: overrides.to_vec(),
        cwd: repo(),
        builtin: release,
        ..LoadRequest::default()
    };
    match lower_request(&req) {
        SpecOutcome::Ok { spec, .. } => *spec,
        SpecOutcome::Errors(checked) => {
            let errors: Vec<String> = checked
                .diagnostics
                .iter()
                .filter(|d| d.is_error())
                .map(|d| format!("{}: {}", d.code, d.message))
                .collect();
            panic!("config errors: {errors:#?}")
        }
    }
}

/// `examples/quickstart.yaml` with `overrides`, lowered as `verlc build` does.
pub fn quickstart(overrides: &[&str]) -> TrainerSpec {
    spec_of(
        "quickstart.yaml",
        &overrides.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    )
}

/// Run options for tests: quiet, CPU, fp32.
pub fn quiet() -> RunOptions {
    RunOptions {
        console_lines: false,
        rollout_replica: Some(replica_command()),
        ..RunOptions::default()
    }
}

/// separate_async's rollout replicas: this test binary, running [`rollout_replica_child`].
pub fn replica_command() -> verlc_runtime::workers::rollout_pool::ReplicaCommand {
    verlc_runtime::workers::rollout_pool::ReplicaCommand::new(
        std::env::current_exe().expect("the test binary's path"),
        ["--exact", "support::rollout_replica_child", "--nocapture"]
            .map(std::ffi::OsString::from)
            .to_vec(),
    )
}

/// A rollout replica process of a test's run (nothing in a normal test run).
#[test]
fn rollout_replica_child() {
    if let Some(served) = verlc_runtime::workers::rollout_pool::serve_if_replica() {
        served.expect("the rollout replica serves its rank");
        crate::common::rank_passed();
    }
}

/// A small, fast GRPO run of the quickstart in `dir` (checkpoints and logs there).
pub fn small_grpo(dir: &Path, steps: u64, extra: &[&str]) -> TrainerSpec {
    small_grpo_on(dir, steps, extra, BuiltinRelease::V0_7_0)
}

/// [`small_grpo`] on the built-in tree of `release`.
pub fn small_grpo_on(
    dir: &Path,
    steps: u64,
    extra: &[&str],
    release: BuiltinRelease,
) -> TrainerSpec {
    let ckpt = format!("trainer.default_local_dir={}", dir.join("ckpt").display());
    let steps = format!("trainer.total_training_steps={steps}");
    let mut o = vec![
        "actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2'",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "data.val_max_samples=16",
        "trainer.logger=[]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
    ];
    o.push(&ckpt);
    o.push(&steps);
    o.extend_from_slice(extra);
    let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
    spec_on("quickstart.yaml", &o, release)
}

/// The value of metric `name` at each logged step that has it.
pub fn series(history: &[(u64, Metrics)], name: &str) -> Vec<f64> {
    history
        .iter()
        .filter_map(|(_, m)| m.get(name).copied())
        .collect()
}

pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Metrics that are measurements of wall time (never equal between runs).
pub fn is_timing(name: &str) -> bool {
    name.starts_with("timing_s/")
        || name.starts_with("timing_per_token_ms/")
        || name.starts_with("perf/")
}
