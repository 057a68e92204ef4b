//! Checkpoints in verl's layout (docs/training-loop.md), written atomically:
//!
//! ```text
//! {trainer.default_local_dir}/
//! ├── latest_checkpointed_iteration.txt     the last complete step, written last
//! └── global_step_{N}/
//!     ├── actor/huggingface/                config.json, model.safetensors, tokenizer files
//!     ├── actor/optim.safetensors           fp32 main params, optimizer state, lr scheduler
//!     ├── critic/…                          same, when there is a critic
//!     └── data.json                         sampler position, step, KL controller
//! ```
//!
//! A checkpoint is written into a hidden `.global_step_{N}.tmp-{pid}` directory, every file
//! is synced, and the directory is renamed into place; only after the step's metrics are
//! logged is the tracker file replaced (also by rename). A run killed at any moment leaves either the previous
//! complete checkpoint or the new one, never a half-written `global_step_{N}`; leftover
//! temporary directories are removed at the next start.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::SamplerState;

use super::TrainerError;

/// verl's tracker file.
pub const TRACKER: &str = "latest_checkpointed_iteration.txt";
const STEP_PREFIX: &str = "global_step_";
const DATA_FILE: &str = "data.json";

/// Trainer state next to the models (verl's `data.pt` plus what verlc's trainer keeps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub global_step: u64,
    pub sampler: SamplerState,
    /// A `data.sampler` class's place and `state_dict()` (see `data::python`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_sampler: Option<serde_json::Value>,
    /// β of the in-reward KL controller.
    pub kl_coef: f64,
}

fn io(path: &Path, e: std::io::Error) -> TrainerError {
    TrainerError::Checkpoint {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

/// The checkpoint to resume from under `root`, per `trainer.resume_mode` (the RL and the SFT
/// trainer alike): none, the tracker's latest, or `resume_from_path`.
pub fn resume_dir(
    resume: &verlc_spec::trainer::ResumeSpec,
    root: &Path,
) -> Result<Option<PathBuf>, TrainerError> {
    use verlc_spec::trainer::ResumeSpec;
    let bad = |msg: String| TrainerError::Config(msg);
    match resume {
        ResumeSpec::Disable => Ok(None),
        ResumeSpec::Auto => Ok(read_tracker(root)?.map(|s| step_dir(root, s))),
        ResumeSpec::Path { path } => {
            if path.is_empty() {
                return Err(bad(
                    "trainer.resume_mode=resume_path needs trainer.resume_from_path".into(),
                ));
            }
            if !path.contains("global_step_") {
                return Err(bad(format!(
                    "trainer.resume_from_path must point to a global_step_N directory, got `{path}`"
                )));
            }
            Ok(Some(super::absolute(path)))
        }
    }
}

/// `global_step_{N}` under `root`.
pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("{STEP_PREFIX}{step}"))
}

/// The step of a `…/global_step_{N}` path.
pub fn parse_step(path: &Path) -> Option<u64> {
    path.file_name()?
        .to_str()?
        .strip_prefix(STEP_PREFIX)?
        .parse()
        .ok()
}

fn sync_tree(path: &Path) -> Result<(), TrainerError> {
    let meta = fs::metadata(path).map_err(|e| io(path, e))?;
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(|e| io(path, e))? {
            sync_tree(&entry.map_err(|e| io(path, e))?.path())?;
        }
    }
    // Directories are synced too, so renames and new entries inside them are durable.
    fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| io(path, e))
}

fn sync_dir(path: &Path) {
    if let Ok(f) = fs::File::open(path) {
        let _ = f.sync_all();
    }
}

/// Removes temporary directories left by an interrupted save or cleanup.
pub fn remove_leftovers(root: &Path) -> Result<(), TrainerError> {
    let Ok(entries) = fs::read_dir(root) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!(".{STEP_PREFIX}")) || name.starts_with(&format!(".{TRACKER}"))
        {
            let p = entry.path();
            let r = if p.is_dir() {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
            r.map_err(|e| io(&p, e))?;
        }
    }
    Ok(())
}

/// Writes a checkpoint of step `step` and commits it: [`stage`] then [`commit`].
pub fn save_atomic(
    root: &Path,
    step: u64,
    write: impl FnOnce(&Path) -> Result<(), TrainerError>,
) -> Result<PathBuf, TrainerError> {
    let dst = stage(root, step, write)?;
    commit(root, step)?;
    Ok(dst)
}

/// Writes the files of step `step`'s checkpoint: `write` fills a temporary directory, which
/// is then synced and renamed to `global_step_{step}`. The tracker is not touched, so a
/// resume still starts from the previous checkpoint until [`commit`]; the trainer logs the
/// step's metrics in between, which keeps the metrics log and the checkpoints consistent
/// whenever the process is killed.
pub fn stage(
    root: &Path,
    step: u64,
    write: impl FnOnce(&Path) -> Result<(), TrainerError>,
) -> Result<PathBuf, TrainerError> {
    let tmp = temp_dir(root, step, u64::from(std::process::id()));
    begin(root, &tmp)?;
    write(&tmp)?;
    finish(root, step, &tmp)
}

/// The hidden directory step `step` is written into; `tag` tells concurrent writers apart
/// (a process id; all ranks of a run use rank 0's).
pub fn temp_dir(root: &Path, step: u64, tag: u64) -> PathBuf {
    root.join(format!(".{STEP_PREFIX}{step}.tmp-{tag}"))
}

/// Creates the empty temporary directory `tmp` (the first part of [`stage`]).
pub fn begin(root: &Path, tmp: &Path) -> Result<(), TrainerError> {
    fs::create_dir_all(root).map_err(|e| io(root, e))?;
    if tmp.exists() {
        fs::remove_dir_all(tmp).map_err(|e| io(tmp, e))?;
    }
    fs::create_dir_all(tmp).map_err(|e| io(tmp, e))
}

/// Syncs the written `tmp` and renames it to `global_step_{step}` (the last part of
/// [`stage`]).
pub fn finish(root: &Path, step: u64, tmp: &Path) -> Result<PathBuf, TrainerError> {
    sync_tree(tmp)?;
    let dst = step_dir(root, step);
    if dst.exists() {
        let old = root.join(format!(".{STEP_PREFIX}{step}.old-{}", std::process::id()));
        fs::rename(&dst, &old).map_err(|e| io(&dst, e))?;
        fs::rename(tmp, &dst).map_err(|e| io(&dst, e))?;
        fs::remove_dir_all(&old).map_err(|e| io(&old, e))?;
    } else {
        fs::rename(tmp, &dst).map_err(|e| io(&dst, e))?;
    }
    sync_dir(root);
    Ok(dst)
}

/// Makes the staged checkpoint of `step` the one a resume starts from (the tracker).
pub fn commit(root: &Path, step: u64) -> Result<(), TrainerError> {
    write_tracker(root, step)
}

fn write_tracker(root: &Path, step: u64) -> Result<(), TrainerError> {
    let tmp = root.join(format!(".{TRACKER}.tmp-{}", std::process::id()));
    fs::write(&tmp, step.to_string()).map_err(|e| io(&tmp, e))?;
    fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| io(&tmp, e))?;
    let dst = root.join(TRACKER);
    fs::rename(&tmp, &dst).map_err(|e| io(&dst, e))?;
    sync_dir(root);
    Ok(())
}

/// The step named by the tracker, if there is one.
pub fn read_tracker(root: &Path) -> Result<Option<u64>, TrainerError> {
    let path = root.join(TRACKER);
    match fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| TrainerError::Checkpoint {
                path,
                msg: format!("expected a step number, found {:?}", text.trim()),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&path, e)),
    }
}

pub fn write_state(dir: &Path, state: &TrainerState) -> Result<(), TrainerError> {
    let path = dir.join(DATA_FILE);
    let text = serde_json::to_string_pretty(state).map_err(|e| TrainerError::Checkpoint {
        path: path.clone(),
        msg: e.to_string(),
    })?;
    fs::write(&path, text).map_err(|e| io(&path, e))
}

pub fn read_state(dir: &Path) -> Result<TrainerState, TrainerError> {
    let path = dir.join(DATA_FILE);
    let text = fs::read_to_string(&path).map_err(|e| io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| TrainerError::Checkpoint {
        path,
        msg: e.to_string(),
    })
}

/// Complete checkpoints under `root`, oldest first.
pub fn list_steps(root: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = fs::read_dir(root)
        .map(|it| {
            it.flatten()
                .filter(|e| e.path().is_dir())
                .filter_map(|e| parse_step(&e.path()))
                .collect()
        })
        .unwrap_or_default();
    steps.sort_unstable();
    steps
}

/// Keeps the newest `max_actor` actor and `max_critic` critic checkpoints (None: all); a
/// step directory left without either is removed (renamed away first, so no reader sees it
/// half-deleted).
pub fn apply_retention(
    root: &Path,
    max_actor: Option<usize>,
    max_critic: Option<usize>,
) -> Result<(), TrainerError> {
    let steps = list_steps(root);
    let keep = |max: Option<usize>, i: usize| max.is_none_or(|m| i + m >= steps.len());
    for (i, &s) in steps.iter().enumerate() {
        let dir = step_dir(root, s);
        let (ka, kc) = (keep(max_actor, i), keep(max_critic, i));
        if ka && kc {
            continue;
        }
        let has_critic = dir.join("critic").is_dir();
        if !ka && (!kc || !has_critic) {
            let trash = root.join(format!(".{STEP_PREFIX}{s}.old-{}", std::process::id()));
            fs::rename(&dir, &trash).map_err(|e| io(&dir, e))?;
            fs::remove_dir_all(&trash).map_err(|e| io(&trash, e))?;
            continue;
        }
        for (kept, role) in [(ka, "actor"), (kc, "critic")] {
            let sub = dir.join(role);
            if !kept && sub.is_dir() {
                fs::remove_dir_all(&sub).map_err(|e| io(&sub, e))?;
            }
        }
    }
    sync_dir(root);
    Ok(())
}
