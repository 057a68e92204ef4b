//! Checkpoints: atomic saves (a failing or killed save leaves nothing visible), the tracker,
//! retention, and the layout a real run writes.

use std::fs;

use verlc_runtime::trainer::TrainerError;
use verlc_runtime::trainer::checkpoint::{
    TRACKER, apply_retention, list_steps, read_tracker, remove_leftovers, save_atomic, step_dir,
};

use crate::support::{quiet, scratch, small_grpo};

fn write_files(dir: &std::path::Path) -> Result<(), TrainerError> {
    fs::create_dir_all(dir.join("actor")).map_err(|e| TrainerError::Config(e.to_string()))?;
    fs::write(dir.join("actor/weights"), b"w").map_err(|e| TrainerError::Config(e.to_string()))?;
    fs::write(dir.join("data.json"), b"{}").map_err(|e| TrainerError::Config(e.to_string()))
}

#[test]
fn a_failed_save_leaves_the_previous_checkpoint_and_no_partial_one() {
    let root = scratch("ckpt_atomic");
    save_atomic(&root, 1, write_files).expect("first save");
    assert_eq!(read_tracker(&root).expect("tracker"), Some(1));
    let err = save_atomic(&root, 2, |dir| {
        write_files(dir)?;
        Err(TrainerError::Config("disk full (simulated)".into()))
    });
    assert!(err.is_err());
    assert!(
        !step_dir(&root, 2).exists(),
        "no half-written global_step_2"
    );
    assert_eq!(read_tracker(&root).expect("tracker"), Some(1));
    assert_eq!(list_steps(&root), vec![1]);
    // The temporary directory is cleaned at the next start.
    assert!(
        fs::read_dir(&root)
            .expect("ls")
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with('.'))
    );
    remove_leftovers(&root).expect("cleanup");
    assert!(
        !fs::read_dir(&root)
            .expect("ls")
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with('.'))
    );
    // Saving the same step again replaces it.
    save_atomic(&root, 1, write_files).expect("resave");
    assert_eq!(list_steps(&root), vec![1]);
    assert_eq!(
        fs::read_to_string(root.join(TRACKER)).expect("tracker"),
        "1"
    );
}

#[test]
fn retention_keeps_the_newest() {
    let root = scratch("ckpt_retention");
    for s in 1..=4 {
        save_atomic(&root, s, |dir| {
            write_files(dir)?;
            fs::create_dir_all(dir.join("critic")).map_err(|e| TrainerError::Config(e.to_string()))
        })
        .expect("save");
    }
    apply_retention(&root, Some(3), Some(2)).expect("retention");
    assert_eq!(list_steps(&root), vec![2, 3, 4]);
    assert!(!step_dir(&root, 2).join("critic").exists());
    assert!(step_dir(&root, 2).join("actor").exists());
    assert!(step_dir(&root, 3).join("critic").exists());
    apply_retention(&root, Some(1), Some(1)).expect("retention");
    assert_eq!(list_steps(&root), vec![4]);
    assert_eq!(read_tracker(&root).expect("tracker"), Some(4));
}

#[test]
fn a_run_writes_verls_layout() {
    let dir = scratch("ckpt_layout");
    let cfg = small_grpo(
        &dir,
        3,
        &["trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2"],
    );
    let summary = verlc_runtime::trainer::run(&cfg, &quiet()).expect("runs");
    assert_eq!(summary.last_step, 3);
    let root = dir.join("ckpt");
    assert_eq!(list_steps(&root), vec![2, 3]);
    assert_eq!(read_tracker(&root).expect("tracker"), Some(3));
    let step = step_dir(&root, 3);
    for f in [
        "actor/huggingface/config.json",
        "actor/huggingface/model.safetensors",
        "actor/huggingface/tokenizer.json",
        "actor/optim.safetensors",
        "data.json",
    ] {
        assert!(step.join(f).is_file(), "missing {f}");
    }
    let state: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(step.join("data.json")).expect("data"))
            .expect("json");
    assert_eq!(state["global_step"], 3);
    assert_eq!(state["sampler"]["cursor"], 24);

    // resume_path: continue from an explicit checkpoint (here the older one).
    let from = format!("trainer.resume_from_path={}", step_dir(&root, 2).display());
    let cfg = small_grpo(
        &dir,
        3,
        &[
            "trainer.save_freq=1",
            "trainer.resume_mode=resume_path",
            &from,
        ],
    );
    let summary = verlc_runtime::trainer::run(&cfg, &quiet()).expect("resumes");
    assert_eq!((summary.resumed_from, summary.last_step), (2, 3));
    // A resume_from_path that names no global_step_N folder is refused by `verlc check` already.
}
