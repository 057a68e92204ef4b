//! `verlc smoke`: a run whose model has no weights here runs end to end on CPU with a
//! scaled-down stand-in of its own `config.json`, its real tokenizer and chat template, the
//! config's data and reward; a run that cannot work stops with exit 1 and the reason.

use std::path::{Path, PathBuf};
use std::process::Command;

fn checkout() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("..")
}

fn python() -> Option<PathBuf> {
    let p = checkout().join(".venv/bin/python");
    if p.is_file() {
        Some(p)
    } else {
        testkit::missing_data("no .venv/bin/python (scripts/setup creates it)");
        None
    }
}

/// A 7B-shaped Qwen2 model directory with no weights: `config.json` and a byte-level BPE
/// tokenizer (trained here by the `tokenizers` library, ChatML special tokens and template).
fn model_dir(python: &Path, dir: &Path, chat_template: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let script = r#"
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
out, chat = sys.argv[1], sys.argv[2] == "1"
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(["reverse the digits 12345 into 54321, user assistant"] * 20, trainer)
tok.save(f"{out}/tokenizer.json")
cfg = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
if chat:
    cfg["chat_template"] = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
json.dump(cfg, open(f"{out}/tokenizer_config.json", "w"))
json.dump({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
           "vocab_size": tok.get_vocab_size(), "hidden_size": 3584, "intermediate_size": 18944,
           "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
           "tie_word_embeddings": False, "hidden_act": "silu",
           "eos_token_id": tok.token_to_id("<|im_end|>"),
           "pad_token_id": tok.token_to_id("<|endoftext|>")},
          open(f"{out}/config.json", "w"))
"#;
    let status = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(dir)
        .arg(if chat_template { "1" } else { "0" })
        .status()
        .expect("run python");
    assert!(status.success(), "writing the model dir failed");
}

fn smoke(model: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| checkout().join("target"));
    let out = Command::new(env!("CARGO_BIN_EXE_verlc"))
        .current_dir(checkout())
        .env("NO_COLOR", "1")
        .env("VERLC_PYTHON", "")
        .env(
            "VERLC_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("verlc-build-test"),
        )
        .env("VERLC_TARGET_DIR", target)
        .args(["smoke", "examples/quickstart.yaml", "--format", "json"])
        .arg(format!("actor_rollout_ref.model.path={}", model.display()))
        .args(extra)
        .output()
        .expect("run verlc smoke");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_7b_shaped_run_without_weights_smokes_on_cpu_and_a_broken_one_is_reported() {
    let Some(python) = python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good");
    model_dir(&python, &good, true);

    let (code, stdout, stderr) = smoke(&good, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("json report");
    assert_eq!(report["ok"], true);
    let subs = report["substituted"].as_array().unwrap();
    let value = |key: &str| {
        subs.iter()
            .find(|s| s["key"] == key)
            .and_then(|s| s["value"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(
        value("actor_rollout_ref.model.path"),
        format!("builtin://scaled?from={}", good.display())
    );
    assert_eq!(
        value("actor_rollout_ref.model.tokenizer_path"),
        good.display().to_string()
    );
    assert_eq!(value("trainer.n_gpus_per_node"), "2");
    let phases = report["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2, "{phases:?}");
    assert!(phases.iter().all(|p| p["ok"] == true), "{phases:?}");
    assert!(
        stderr.contains("step:3 "),
        "the resumed run trains step 3:\n{stderr}"
    );
    // The stand-in kept the tokenizer's vocabulary: a random model's entropy is about
    // ln(vocabulary), above ln(100) here, where the built-in tokenizer's would be ln(38).
    let entropy: f64 = stderr
        .split("actor/entropy:")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .expect("an entropy metric");
    assert!(entropy > 100f64.ln(), "entropy {entropy}");

    // A tokenizer without a chat template: the data's chat prompts cannot be rendered.
    let no_chat = tmp.path().join("no_chat");
    model_dir(&python, &no_chat, false);
    let (code, stdout, stderr) = smoke(&no_chat, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no chat template"), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("json report");
    assert_eq!(report["ok"], false);

    // A model directory without config.json: reported before anything is built.
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, _, stderr) = smoke(&empty, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no config.json"), "{stderr}");
    assert!(!stderr.contains("compiling"), "{stderr}");
}
