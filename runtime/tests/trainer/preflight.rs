//! The trainer's preflight (`verlc_runtime::trainer::preflight`): a run whose weights are missing or
//! whose models cannot fit in this host's memory stops before any model is allocated, naming
//! the key, the directory and the numbers.

use std::path::Path;

use verlc_runtime::trainer::preflight::{PreflightError, check};

use crate::support::{quickstart, scratch};

/// A checkpoint directory whose `model.safetensors` holds only a header: `shapes` named
/// tensors of bf16 (no data is read by the preflight).
fn header_only(dir: &Path, shapes: &[(&str, &[u64])]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut header = serde_json::Map::new();
    for (name, shape) in shapes {
        header.insert(
            (*name).to_owned(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}),
        );
    }
    let text = serde_json::to_vec(&header).unwrap();
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

pub(crate) const GIB: u64 = 1 << 30;

/// A 7B-parameter Qwen2-shaped checkpoint of headers only, in `dir/seven_b`.
pub(crate) fn seven_b_checkpoint(dir: &Path) -> std::path::PathBuf {
    let big = dir.join("seven_b");
    std::fs::create_dir_all(&big).unwrap();
    std::fs::write(big.join("config.json"), CONFIG).unwrap();
    header_only(
        &big,
        &[
            ("model.embed_tokens.weight", &[152_064, 3_584]),
            ("model.layers.weight", &[6_500_000_000]),
        ],
    );
    big
}

/// A Qwen2-7B-shaped `config.json`.
const CONFIG: &str = r#"{"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
  "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
  "num_key_value_heads": 4, "eos_token_id": 151645}"#;

#[test]
fn missing_weights_and_models_too_large_for_the_host_stop_before_loading() {
    let dir = scratch("preflight");
    let mut spec = quickstart(&[]);
    // The built-in model has no files to find, and fits anywhere.
    check(&spec, Some(GIB)).unwrap();

    // A directory with a config and no weights.
    let empty = dir.join("no_weights");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("config.json"), CONFIG).unwrap();
    spec.actor.model_path = empty.display().to_string();
    let e = check(&spec, None).unwrap_err();
    assert!(
        matches!(
            e,
            PreflightError::Weights {
                key: "actor_rollout_ref.model.path",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("model.safetensors"), "{e}");

    // A 7B-parameter checkpoint (headers only) on a host with 24 GiB available: refused with
    // both numbers; with enough memory it passes without reading a tensor.
    let big = seven_b_checkpoint(&dir);
    spec.actor.model_path = big.display().to_string();
    let e = check(&spec, Some(24 * GIB)).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PreflightError::Memory { .. }), "{text}");
    assert!(text.contains("24.0 GiB available"), "{text}");
    assert!(text.contains("actor 7.04B parameters"), "{text}");
    assert!(text.contains("actor_rollout_ref.model.path"), "{text}");
    check(&spec, Some(1 << 40)).unwrap();
    check(&spec, None).unwrap();

    // A header cut short is a corrupt file, named.
    let cut = dir.join("cut");
    std::fs::create_dir_all(&cut).unwrap();
    std::fs::write(cut.join("config.json"), CONFIG).unwrap();
    std::fs::write(cut.join("model.safetensors"), 4096u64.to_le_bytes()).unwrap();
    spec.actor.model_path = cut.display().to_string();
    let e = check(&spec, None).unwrap_err().to_string();
    assert!(
        e.contains("corrupt or truncated") && e.contains("model.safetensors"),
        "{e}"
    );
}
