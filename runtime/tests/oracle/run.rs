//! Runs `tests/oracle/model_oracle.py` (transformers as the oracle) once per script version
//! and arguments, caching the output directory under the system temp dir so the model,
//! rollout and tokenizer test binaries share one run.
#![allow(dead_code)]

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

#[path = "../common/python.rs"]
mod python_run;
pub use python_run::run_script;

pub fn script() -> PathBuf {
    script_named("model_oracle.py")
}

pub fn script_named(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/oracle")
        .join(name)
}

/// The venv's python, failing with a pointer to scripts/setup when it is missing.
pub fn python() -> PathBuf {
    let py = std::env::var_os("VERLC_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"));
    assert!(
        py.is_file(),
        "python with torch/transformers not found at {} — run scripts/setup (creates .venv) and `source scripts/cargo-env`",
        py.display()
    );
    py
}

/// Runs `python model_oracle.py <cmd> OUTDIR <inputs>` once; returns OUTDIR (cached by content
/// hash of the script and the inputs' contents).
pub fn cached(cmd: &str, inputs: &[&Path]) -> PathBuf {
    cached_with(&script(), cmd, inputs)
}

/// The transformers 5 packages (Qwen3.5 and the other families transformers 4.57 predates),
/// installed by scripts/setup beside the venv's transformers 4.57:
/// `$VERLC_TRANSFORMERS5`, else `.venv/transformers5`.
pub fn transformers5() -> PathBuf {
    let dir = std::env::var_os("VERLC_TRANSFORMERS5")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/transformers5"));
    assert!(
        dir.join("transformers").is_dir(),
        "transformers 5 not found at {} — run scripts/setup",
        dir.display()
    );
    dir
}

/// [`cached_with`] for a script that runs on transformers 5 ([`transformers5`]).
pub fn cached_transformers5(script: &Path, cmd: &str) -> PathBuf {
    cached_run(script, cmd, &[], Some(&transformers5()))
}

/// [`cached`] for another oracle script.
pub fn cached_with(script: &Path, cmd: &str, inputs: &[&Path]) -> PathBuf {
    cached_run(script, cmd, inputs, None)
}

/// [`run_script`] on the venv's python with one OpenMP thread, `PYTHONPATH` at `path` where
/// one is given (transformers 5), and `extra` variables.
fn run_oracle(
    script: &Path,
    args: &[&Path],
    path: Option<&Path>,
    extra: &[(&str, &str)],
) -> std::process::ExitStatus {
    let path = path.map(|p| p.display().to_string());
    let mut env = vec![("OMP_NUM_THREADS", "1")];
    env.extend_from_slice(extra);
    if let Some(p) = &path {
        env.push(("PYTHONPATH", p.as_str()));
    }
    run_script(&python(), script, args, &env)
}

fn cached_run(script: &Path, cmd: &str, inputs: &[&Path], path: Option<&Path>) -> PathBuf {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(script)
        .expect("read oracle script")
        .hash(&mut h);
    cmd.hash(&mut h);
    for p in inputs {
        std::fs::read(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .hash(&mut h);
    }
    let base = std::env::temp_dir().join("verlc-oracle");
    let out = base.join(format!("{cmd}-{:016x}", h.finish()));
    if out.join("DONE").is_file() {
        return out;
    }
    std::fs::create_dir_all(&base).expect("create oracle cache dir");
    let tmp = base.join(format!(
        "tmp-{cmd}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut args = vec![Path::new(cmd), tmp.as_path()];
    args.extend_from_slice(inputs);
    let status = run_oracle(script, &args, path, &[("TOKENIZERS_PARALLELISM", "false")]);
    assert!(status.success(), "oracle `{cmd}` failed: {status}");
    std::fs::write(tmp.join("DONE"), "").expect("mark oracle output");
    // Another process may have won the race; either copy is complete.
    if std::fs::rename(&tmp, &out).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    out
}

/// Every output of `vision_oracle.py all` (vision towers, M-RoPE ids, images, vision prompts):
/// one Python run shared by the model and data test binaries.
pub fn vision() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let template = script_named("qwen_vl_chat_template.jinja");
        let bpe = script_named("model_oracle.py");
        cached_with(
            &script_named("vision_oracle.py"),
            "all",
            &[bpe.as_path(), template.as_path()],
        )
    })
    .clone()
}

/// `vision_oracle.py models` run on transformers 5 (its Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE and
/// Qwen3.5's image-text models,
/// and the checkpoint layout it saves: `rope_parameters`, experts in its orientation), in one
/// interpreter: Qwen2.5-VL's files at the top, the others' under their family's folder.
pub fn vision_transformers5() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| cached_transformers5(&script_named("vision_oracle.py"), "models"))
        .clone()
}

/// Qwen3-VL's run of [`vision_transformers5`].
pub fn qwen3_vl_transformers5() -> PathBuf {
    vision_transformers5().join("qwen3_vl")
}

/// Qwen3-VL-MoE's run of [`vision_transformers5`].
pub fn qwen3_vl_moe_transformers5() -> PathBuf {
    vision_transformers5().join("qwen3_vl_moe")
}

/// Qwen3.5's image-text model's run of [`vision_transformers5`].
pub fn qwen3_5_vl_transformers5() -> PathBuf {
    vision_transformers5().join("qwen3_5")
}

/// Qwen3.5-MoE's image-text model's run of [`vision_transformers5`].
pub fn qwen3_5_moe_vl_transformers5() -> PathBuf {
    vision_transformers5().join("qwen3_5_moe")
}

/// The checkpoints and references of `model_oracle.py models`.
pub fn models() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| cached("models", &[])).clone()
}

/// Runs `verify` on a saved directory and returns the tensors it wrote.
pub fn verify(dir: &Path, kind: &str, inputs: &Path) -> HashMap<String, Tensor> {
    verify_many(&[(dir, kind, inputs)]).remove(0)
}

/// [`verify`] for several directories in one Python process (each start imports torch and
/// transformers: seconds of CPU).
pub fn verify_many(jobs: &[(&Path, &str, &Path)]) -> Vec<HashMap<String, Tensor>> {
    verify_many_on(jobs, None)
}

/// [`verify_many`] on transformers 5 ([`transformers5`]).
pub fn verify_many_transformers5(jobs: &[(&Path, &str, &Path)]) -> Vec<HashMap<String, Tensor>> {
    verify_many_on(jobs, Some(&transformers5()))
}

fn verify_many_on(
    jobs: &[(&Path, &str, &Path)],
    path: Option<&Path>,
) -> Vec<HashMap<String, Tensor>> {
    let outs: Vec<PathBuf> = jobs
        .iter()
        .map(|(dir, kind, _)| dir.join(format!("verify-{kind}.safetensors")))
        .collect();
    let mut args = vec![Path::new("verify")];
    for ((dir, kind, inputs), out) in jobs.iter().zip(&outs) {
        args.extend([*dir, Path::new(*kind), *inputs, out.as_path()]);
    }
    let status = run_oracle(&script(), &args, path, &[]);
    assert!(status.success(), "oracle verify failed: {status}");
    outs.iter().map(|o| read(o)).collect()
}

pub fn read(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect()
}

pub fn get<'a>(m: &'a HashMap<String, Tensor>, k: &str) -> &'a Tensor {
    m.get(k)
        .unwrap_or_else(|| panic!("oracle output has no `{k}`"))
}

pub fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Max |a - b| over positions where `mask` (B, T) is 1, for tensors (B, T, …).
pub fn max_abs_diff_masked(a: &Tensor, b: &Tensor, mask: &Tensor) -> f64 {
    let d = (a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs();
    let d = if d.dim() == 3 { d.amax(-1, false) } else { d };
    (d * mask.to_kind(Kind::Double)).max().double_value(&[])
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// Checkpoints with logits references.
pub const ARCHS: [&str; 12] = [
    "llama",
    "mistral",
    "mistral_window",
    "gemma",
    "gemma2",
    "seed_oss",
    "qwen2",
    "qwen2_window",
    "qwen3",
    "llama_dynamic",
    "qwen3_moe",
    "gpt_oss",
];
/// Checkpoints with greedy-generation references.
pub const GEN_ARCHS: [&str; 11] = [
    "llama",
    "mistral",
    "mistral_window",
    "gemma",
    "gemma2",
    "seed_oss",
    "qwen2",
    "qwen2_window",
    "qwen3",
    "qwen3_moe",
    "gpt_oss",
];

/// A fresh scratch directory for one test.
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir()
        .join(format!("verlc-model-tests-{}", std::process::id()))
        .join(tag);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}
