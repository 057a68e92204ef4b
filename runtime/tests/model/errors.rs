//! Corrupt, truncated and mismatched checkpoints fail with errors that name the file and the
//! tensor.

use std::path::{Path, PathBuf};

use tch::{Device, Tensor};
use verlc_runtime::model::{Dtype, from_pretrained};

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

/// A Mistral's `sliding_window` windows every layer (its logits against transformers':
/// `parity.rs`, the `mistral_window` checkpoint); one that is no positive integer is refused at
/// load, naming the key. Qwen2's window, which only `use_sliding_window` turns on, changes
/// nothing.
#[test]
fn a_sliding_window_loads_and_a_bad_one_is_refused() {
    let set = |arch: &str, name: &str, window: serde_json::Value| {
        let dir = copy_dir(&oracle::models().join(arch), name);
        let cfg_path = dir.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg["sliding_window"] = window;
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        dir
    };
    let e = load_err(&set("mistral", "bad_window", serde_json::json!(0)));
    assert!(
        e.contains("sliding_window must be a positive integer"),
        "{e}"
    );
    for dir in [
        set("mistral", "window", 16.into()),
        set("qwen2", "gated_window", 16.into()),
    ] {
        let m = from_pretrained(dir.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let windowed = m.config.attention_window(0);
        assert_eq!(
            windowed.is_some(),
            dir.ends_with("window"),
            "{}",
            dir.display()
        );
    }
    // `use_sliding_window` windows Qwen2's layers from `max_window_layers` on (parity:
    // `qwen2_window`); a family whose config class does not is refused naming the key.
    let on = |arch: &str, name: &str| {
        let dir = copy_dir(&oracle::models().join(arch), name);
        let cfg_path = dir.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg["use_sliding_window"] = true.into();
        cfg["sliding_window"] = 16.into();
        cfg["max_window_layers"] = 1.into();
        cfg.as_object_mut().unwrap().remove("layer_types");
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        dir
    };
    let qwen2 = on("qwen2", "qwen2_on");
    let m = from_pretrained(qwen2.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0).unwrap();
    assert_eq!(
        (m.config.attention_window(0), m.config.attention_window(1)),
        (None, Some(16))
    );
    // A null window windows nothing, as the class reads it.
    let null = on("qwen2", "qwen2_null");
    let cfg_path = null.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["sliding_window"] = serde_json::Value::Null;
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let m = from_pretrained(null.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0).unwrap();
    assert_eq!(m.config.attention_window(1), None);
    let e = load_err(&on("qwen3_moe", "moe_on"));
    assert!(e.contains("use_sliding_window"), "{e}");
}

/// A `config.json` that leaves keys out is read with its family's config class defaults, as
/// transformers reads it: Gemma ties its embeddings, gates with tanh-GELU and has 256-wide
/// heads; Seed-OSS has q/k/v biases (not on the output projection) and dropouts of 0.1, which
/// a trained model refuses (verlc's models have no dropout) until overridden to zero.
#[test]
fn absent_keys_take_the_family_defaults_and_dropout_is_refused_for_training() {
    use verlc_runtime::model::ModelConfig;
    let write = |tag: &str, cfg: serde_json::Value| {
        let dir = oracle::scratch(tag);
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        ModelConfig::from_file(&dir.join("config.json")).unwrap()
    };
    let sizes = serde_json::json!({
        "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4,
    });
    let with_type = |t: &str| {
        let mut v = sizes.clone();
        v["model_type"] = t.into();
        v
    };
    let gemma = write("gemma_defaults", with_type("gemma"));
    assert!(gemma.tie_word_embeddings);
    assert_eq!(gemma.hidden_act, "gelu_pytorch_tanh");
    assert_eq!(gemma.head_dim(), 256);
    assert!(gemma.zero_centered_norm());
    assert_eq!(gemma.embedding_scale(), Some(8.0));
    assert!(gemma.training_problem().is_none());
    // Keys the file sets win over the defaults.
    let mut exact = with_type("gemma");
    exact["hidden_act"] = "gelu".into();
    exact["tie_word_embeddings"] = false.into();
    let exact = write("gemma_set", exact);
    assert_eq!(
        (exact.hidden_act.as_str(), exact.tie_word_embeddings),
        ("gelu", false)
    );

    let seed = write("seed_oss_defaults", with_type("seed_oss"));
    assert!(seed.qkv_bias() && !seed.o_bias());
    assert_eq!(seed.head_dim(), 128);
    let why = seed.training_problem().expect("dropout refused");
    assert!(
        why.contains("attention_dropout = 0.1") && why.contains("override_config"),
        "{why}"
    );
    let off: serde_json::Map<String, serde_json::Value> = serde_json::from_value(
        serde_json::json!({"attention_dropout": 0.0, "residual_dropout": 0.0}),
    )
    .unwrap();
    assert!(
        seed.with_overrides(&off)
            .unwrap()
            .training_problem()
            .is_none()
    );
    let mut out_bias = with_type("seed_oss");
    out_bias["attention_out_bias"] = true.into();
    assert!(write("seed_oss_out_bias", out_bias).o_bias());
    // Llama's `attention_bias` still covers the output projection.
    let mut llama = with_type("llama");
    llama["attention_bias"] = true.into();
    let llama = write("llama_bias", llama);
    assert!(llama.qkv_bias() && llama.o_bias() && llama.training_problem().is_none());

    // Every activation the build's check lets through is one the MLP computes.
    for act in verlc_spec::families::GATE_ACTIVATIONS {
        assert!(
            verlc_runtime::model::layers::Activation::of(act).is_some(),
            "{act}"
        );
    }
    // An activation other than SiLU only in dense MLPs (experts are SwiGLU).
    let mut moe = with_type("qwen3_moe");
    for (k, v) in [
        ("num_experts", 4),
        ("num_experts_per_tok", 2),
        ("moe_intermediate_size", 32),
    ] {
        moe[k] = v.into();
    }
    moe["hidden_act"] = "gelu".into();
    let dir = oracle::scratch("moe_gelu");
    std::fs::write(dir.join("config.json"), moe.to_string()).unwrap();
    let e = ModelConfig::from_file(&dir.join("config.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("hidden_act `gelu` with experts"), "{e}");
}
