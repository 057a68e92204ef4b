//! Corrupt, truncated and mismatched checkpoints fail with errors that name the file and the
//! tensor.

use std::path::{Path, PathBuf};

use runtime::model::{Dtype, from_pretrained};
use tch::{Device, Tensor};

use crate::oracle;

fn copy_dir(from: &Path, tag: &str) -> PathBuf {
    let to = oracle::scratch(tag);
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    to
}

fn load_err(dir: &Path) -> String {
    match from_pretrained(dir.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0) {
        Ok(_) => panic!("{} loaded although broken", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_file_names_file_and_tensor() {
    let dir = copy_dir(&oracle::models().join("qwen2"), "truncated");
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let e = load_err(&dir);
    assert!(e.contains(&file.display().to_string()), "{e}");
    assert!(
        e.contains("truncated") && e.contains("tensor `model."),
        "{e}"
    );
}

#[test]
fn garbage_header_names_file() {
    let dir = copy_dir(&oracle::models().join("qwen2"), "garbage");
    let file = dir.join("model.safetensors");
    std::fs::write(
        &file,
        b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!rest",
    )
    .unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains(&file.display().to_string()) && e.contains("corrupt"),
        "{e}"
    );
}

#[test]
fn shape_mismatch_names_tensor() {
    let dir = copy_dir(&oracle::models().join("qwen2"), "shape");
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["intermediate_size"] = 96.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("mlp.") && e.contains("has shape") && e.contains("model.safetensors"),
        "{e}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let dir = copy_dir(&oracle::models().join("qwen2"), "missing");
    let file = dir.join("model.safetensors");
    let kept: Vec<(String, Tensor)> = Tensor::read_safetensors(&file)
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n != "model.norm.weight")
        .collect();
    Tensor::write_safetensors(&kept, &file).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("no tensor `model.norm.weight`"), "{e}");
}

#[test]
fn sharded_index_problems_name_shard_and_tensor() {
    let src = oracle::models().join("llama");
    let dir = copy_dir(&src, "lost-shard");
    std::fs::remove_file(dir.join("model-00003-of-00016.safetensors")).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("model.safetensors.index.json")
            && e.contains("model-00003-of-00016.safetensors"),
        "{e}"
    );

    let dir = copy_dir(&src, "bad-index");
    let idx_path = dir.join("model.safetensors.index.json");
    let mut idx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&idx_path).unwrap()).unwrap();
    idx["weight_map"]["model.layers.9.ghost.weight"] = "model-00002-of-00016.safetensors".into();
    std::fs::write(&idx_path, idx.to_string()).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("model.layers.9.ghost.weight") && e.contains("model-00002-of-00016.safetensors"),
        "{e}"
    );
}

#[test]
fn unsupported_architecture_names_config() {
    let dir = copy_dir(&oracle::models().join("qwen2"), "arch");
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["model_type"] = "gpt2".into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("config.json") && e.contains("model_type `gpt2`"),
        "{e}"
    );
    let e = load_err(&oracle::scratch("empty"));
    assert!(e.contains("config.json"), "{e}");
}

/// A Mistral whose `sliding_window` is shorter than its positions would attend over a window
/// the decoder does not implement: refused at load, naming the key. A window that covers every
/// position, and Qwen2's window that only `use_sliding_window` turns on, change nothing.
#[test]
fn a_sliding_window_shorter_than_the_positions_is_refused() {
    let set = |arch: &str, name: &str, window: i64| {
        let dir = copy_dir(&oracle::models().join(arch), name);
        let cfg_path = dir.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg["sliding_window"] = window.into();
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        dir
    };
    let e = load_err(&set("mistral", "window", 16));
    assert!(
        e.contains("sliding_window = 16") && e.contains("max_position_embeddings (128)"),
        "{e}"
    );
    for dir in [
        set("mistral", "wide_window", 128),
        set("qwen2", "gated_window", 16),
    ] {
        from_pretrained(dir.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
}
