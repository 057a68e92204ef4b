//! Config loading (the quickstart plus overrides, through `verlc check`) and scratch dirs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use runtime::engine::Metrics;
use runtime::trainer::RunOptions;
use verlc::check::{CheckOptions, check};
use verlc::config::VerlConfig;
use verlc::load::compose::LoadRequest;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fresh scratch directory under the target dir.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("trainer_tests").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// `examples/quickstart.yaml` with `overrides`, checked like `verlc check`.
pub fn quickstart(overrides: &[&str]) -> VerlConfig {
    let req = LoadRequest {
        config_file: Some(repo().join("examples/quickstart.yaml")),
        overrides: overrides.iter().map(|s| s.to_string()).collect(),
        cwd: repo(),
        ..LoadRequest::default()
    };
    let checked = check(&req, &CheckOptions::default());
    let errors: Vec<String> = checked.diagnostics.iter().filter(|d| d.is_error()).map(|d| d.message.clone()).collect();
    assert!(errors.is_empty(), "config errors: {errors:#?}");
    checked.config.expect("typed config")
}

/// Run options for tests: quiet, CPU, fp32.
pub fn quiet() -> RunOptions {
    RunOptions { console_lines: false, ..RunOptions::default() }
}

/// A small, fast GRPO run of the quickstart in `dir` (checkpoints and logs there).
pub fn small_grpo(dir: &Path, steps: u64, extra: &[&str]) -> VerlConfig {
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
    quickstart(&o)
}

/// The value of metric `name` at each logged step that has it.
pub fn series(history: &[(u64, Metrics)], name: &str) -> Vec<f64> {
    history.iter().filter_map(|(_, m)| m.get(name).copied()).collect()
}

pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Metrics that are measurements of wall time (never equal between runs).
pub fn is_timing(name: &str) -> bool {
    name.starts_with("timing_s/") || name.starts_with("timing_per_token_ms/") || name.starts_with("perf/")
}
