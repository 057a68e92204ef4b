//! `verlc smoke`: a run whose model has no weights here runs end to end on CPU with a
//! scaled-down stand-in of its own `config.json`, its real tokenizer and chat template, the
//! config's data and reward; a run that cannot work stops with exit 1 and the reason.

use std::path::{Path, PathBuf};
use std::process::Command;

fn checkout() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

fn python() -> Option<PathBuf> {
    let p = checkout().join(".venv/bin/python");
    if p.is_file() {
        Some(p)
    } else {
        verlc_testkit::missing_data("no .venv/bin/python (scripts/setup creates it)");
        None
    }
}

/// A 7B-shaped Qwen2 model directory with no weights: `config.json` and a byte-level BPE
/// tokenizer (trained here by the `tokenizers` library, ChatML special tokens and template).
fn model_dir(python: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let script = r#"
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
out = sys.argv[1]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(["reverse the digits 12345 into 54321, user assistant"] * 20, trainer)
tok.save(f"{out}/tokenizer.json")
cfg = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
       "chat_template": ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")}
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
        .status()
        .expect("run python");
    assert!(status.success(), "writing the model dir failed");
}

/// A copy of the model directory `from` (its config and tokenizer files) at `to`, with the
/// JSON file `file` changed by `edit`.
fn edited_model_dir(from: &Path, to: &Path, file: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    std::fs::create_dir_all(to).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(from.join(file)).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(to.join(file), json.to_string()).unwrap();
}

/// verl's gsm8k preprocess layout (`examples/data_preprocess/gsm8k.py`) in parquet: 40 train
/// and 8 test rows; variants with another data source and with string prompts; reward files.
fn data_dir(python: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let script = r##"
import sys, pyarrow as pa, pyarrow.parquet as pq
out = sys.argv[1]
def row(i, source="openai/gsm8k", chat=True):
    q = f"What is {i} plus {i}? Let's think step by step and output the final answer after {chr(35) * 4}."
    prompt = [{"role": "user", "content": q}] if chat else q
    return {"data_source": source, "prompt": prompt, "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i}}
pq.write_table(pa.Table.from_pylist([row(i) for i in range(40)]), f"{out}/train.parquet")
pq.write_table(pa.Table.from_pylist([row(i) for i in range(8)]), f"{out}/test.parquet")
pq.write_table(pa.Table.from_pylist([row(i, source="my_task") for i in range(40)]), f"{out}/other_source.parquet")
pq.write_table(pa.Table.from_pylist([row(i, chat=False) for i in range(40)]), f"{out}/string_prompt.parquet")
sig = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
open(f"{out}/reward_ok.py", "w").write(sig + "    return float(ground_truth in solution_str)\n")
open(f"{out}/reward_raises.py", "w").write(sig + "    return int(solution_str.split(chr(35) * 4)[1])\n")
open(f"{out}/reward_text.py", "w").write(sig + "    return 'good'\n")
"##;
    let status = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(dir)
        .status()
        .expect("run python");
    assert!(status.success(), "writing the data failed");
}

/// A GRPO run as verl's gsm8k example writes it (8 GPUs, vLLM, batch 256 x 5), on `data`.
fn grpo_config(dir: &Path, data: &Path, model: &Path) -> PathBuf {
    let text = format!(
        "data:
  train_files: {d}/train.parquet
  val_files: {d}/test.parquet
  train_batch_size: 256
  max_prompt_length: 512
  max_response_length: 1024
  filter_overlong_prompts: true
  truncation: error
actor_rollout_ref:
  model:
    path: {m}
    use_remove_padding: true
  actor:
    optim:
      lr: 1.0e-6
    ppo_mini_batch_size: 64
    ppo_micro_batch_size_per_gpu: 8
    use_kl_loss: true
  rollout:
    name: vllm
    n: 5
    tensor_model_parallel_size: 2
    log_prob_micro_batch_size_per_gpu: 32
  ref:
    log_prob_micro_batch_size_per_gpu: 32
custom_reward_function:
  path: {d}/reward_ok.py
algorithm:
  adv_estimator: grpo
trainer:
  n_gpus_per_node: 8
  logger: [console, wandb]
  total_epochs: 15
  save_freq: 20
  test_freq: 5
",
        d = data.display(),
        m = model.display()
    );
    let file = dir.join("grpo.yaml");
    std::fs::write(&file, text).unwrap();
    file
}

/// The Hub cache the smoke runs see (offline).
fn hub_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("smoke-hub")
}

/// `dir`'s files as the Hub cache holds a snapshot of `org/name` (no weights in it).
fn cache_as_hub_model(dir: &Path, name: &str) {
    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
    let repo = hub_cache().join(format!("models--org--{name}"));
    let snap = repo.join("snapshots").join(COMMIT);
    let _ = std::fs::remove_dir_all(&repo);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join(f), snap.join(f)).unwrap();
    }
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
}

/// `verlc smoke --format json ARGS` (trainers built in the test target): exit code, stdout,
/// stderr.
fn verlc_smoke(args: &[String]) -> (Option<i32>, String, String) {
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
        .env("HF_HUB_CACHE", hub_cache())
        .env("HF_HUB_OFFLINE", "1")
        .env_remove("HF_ENDPOINT")
        .args(["smoke", "--format", "json"])
        .args(args)
        .output()
        .expect("run verlc smoke");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The smoke run of `config` on verl 0.7.0's tree with `extra` overrides.
fn smoke_config(config: &Path, extra: &[String]) -> (Option<i32>, String, String) {
    let mut args = vec![
        config.display().to_string(),
        "--verl-version".into(),
        "0.7.0".into(),
    ];
    args.extend_from_slice(extra);
    verlc_smoke(&args)
}

/// The smoke run of the quickstart with its model at `model`.
fn smoke(model: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec![
        "examples/quickstart.yaml".to_owned(),
        format!("actor_rollout_ref.model.path={}", model.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    verlc_smoke(&args)
}

#[test]
fn a_7b_shaped_run_without_weights_smokes_on_cpu_and_a_broken_one_is_reported() {
    let Some(python) = python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good");
    model_dir(&python, &good);

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
    // GRPO without a critic or a reward model: their sections' settings are not reported.
    let keys: Vec<&str> = subs.iter().filter_map(|s| s["key"].as_str()).collect();
    assert!(
        keys.iter()
            .all(|k| !k.starts_with("critic.") && !k.starts_with("reward_model.")),
        "{keys:?}"
    );
    let exercised = report["exercised"].as_array().unwrap();
    assert!(
        exercised
            .iter()
            .any(|e| e.as_str().is_some_and(|e| e.contains("estimator Grpo"))),
        "{exercised:?}"
    );
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

    // The same model by Hub id, its configs and tokenizer in the Hub cache and no weights:
    // planned only (`--plan`), since the run after the substitution is the one above.
    cache_as_hub_model(&good, "qwen7b-smoke");
    let args = [
        "examples/quickstart.yaml",
        "actor_rollout_ref.model.path=org/qwen7b-smoke",
        "--plan",
    ]
    .map(str::to_owned);
    let (code, stdout, stderr) = verlc_smoke(&args);
    assert_eq!(code, Some(0), "{stderr}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).expect("json plan");
    assert_eq!(plan["planned"], true, "{stdout}");
    let path = plan["substituted"]
        .as_array()
        .and_then(|subs| {
            subs.iter()
                .find(|s| s["key"] == "actor_rollout_ref.model.path")
        })
        .and_then(|s| s["value"].as_str())
        .unwrap_or_default();
    assert!(
        path.starts_with("builtin://scaled?from=") && path.contains("models--org--qwen7b-smoke"),
        "{stdout}"
    );
    assert!(
        plan["exercised"].as_array().is_some_and(|e| !e.is_empty()),
        "{stdout}"
    );
    assert!(!stderr.contains("compiling"), "{stderr}");

    // A Qwen3-MoE 30B-A3B config (128 experts, top-8, a vocabulary padded past the
    // tokenizer's): the stand-in keeps 8 experts and ends its vocabulary at the tokenizer's, so
    // no padding id is sampled.
    let moe = tmp.path().join("moe");
    std::fs::create_dir_all(&moe).unwrap();
    std::fs::copy(
        checkout().join("tests/fixtures/models/qwen3_30b_a3b.json"),
        moe.join("config.json"),
    )
    .unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(good.join(f), moe.join(f)).unwrap();
    }
    let (code, _, stderr) = smoke(&moe, &["--steps=1"]);
    assert_eq!(code, Some(0), "{stderr}");

    // A tokenizer without a chat template: the data's chat prompts cannot be rendered.
    let no_chat = tmp.path().join("no_chat");
    edited_model_dir(&good, &no_chat, "tokenizer_config.json", |c| {
        let removed = c.as_object_mut().and_then(|c| c.remove("chat_template"));
        assert!(removed.is_some(), "the good model has a chat template");
    });
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

/// A vision-language run as verl's Qwen3-VL example writes it (GRPO on geo3k: rows whose
/// prompts hold `<image>` and whose `images` column holds PNG bytes) smokes end to end on CPU:
/// a Qwen3-VL-8B-shaped model directory (config.json with its tower, the Qwen3 tokenizer's
/// vision tokens at their ids, Qwen3-VL's preprocessor_config.json; no weights, from
/// scripts/verl_shapes.py), its stand-in scaled down with the tower, the pictures prepared by
/// its processor and scored by verl's geometry3k rule.
#[test]
fn a_qwen3_vl_run_on_pictures_smokes_on_cpu() {
    let Some(python) = python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (model, data) = (
        tmp.path().join("Qwen3-VL-8B-Instruct"),
        tmp.path().join("geo3k"),
    );
    let script = r#"
import sys
sys.path.insert(0, sys.argv[1])
import verl_shapes
assert verl_shapes.write_model(sys.argv[2], "Qwen/Qwen3-VL-8B-Instruct")
verl_shapes.write_data(f"{sys.argv[3]}/train.parquet", "geo3k", "train", 16)
verl_shapes.write_data(f"{sys.argv[3]}/test.parquet", "geo3k", "test", 4)
"#;
    let status = Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(checkout().join("scripts"))
        .arg(&model)
        .arg(&data)
        .status()
        .expect("run python");
    assert!(status.success(), "writing the model and data failed");
    let args: Vec<String> = vec![
        "examples/quickstart.yaml".into(),
        format!("actor_rollout_ref.model.path={}", model.display()),
        format!("data.train_files={}/train.parquet", data.display()),
        format!("data.val_files={}/test.parquet", data.display()),
        "data.image_key=images".into(),
        "data.max_prompt_length=1024".into(),
        "--steps=1".into(),
    ];
    let (code, stdout, stderr) = verlc_smoke(&args);
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("json report");
    assert_eq!(report["ok"], true, "{stdout}");
    assert!(
        stdout.contains("builtin://scaled?from=") && stderr.contains("step:1 "),
        "{stdout}\n{stderr}"
    );
    let exercised: Vec<&str> = report["exercised"]
        .as_array()
        .expect("exercised")
        .iter()
        .filter_map(serde_json::Value::as_str)
        .collect();
    assert!(
        exercised
            .iter()
            .any(|e| e.starts_with("Qwen3-VL (vision-language): the rows' images (`images`)")),
        "{exercised:?}"
    );
}

/// One good run written as verl's gsm8k example, and broken runs made from it: each exits 1
/// with its cause (the key, the file and row, the function) in the message.
#[test]
fn broken_runs_are_reported_with_their_cause() {
    let Some(python) = python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (model, data) = (tmp.path().join("model"), tmp.path().join("data"));
    model_dir(&python, &model);
    data_dir(&python, &data);
    let config = grpo_config(tmp.path(), &data, &model);
    let (code, stdout, stderr) = smoke_config(&config, &[]);
    assert_eq!(code, Some(0), "the good run: {stderr}");
    assert!(stdout.contains("\"ok\": true"), "{stdout}");

    // Model directories with one thing wrong in their config.json.
    let with_config = |name: &str, key: &str, value: serde_json::Value| {
        let dir = tmp.path().join(name);
        edited_model_dir(&model, &dir, "config.json", |cfg| cfg[key] = value);
        dir
    };
    let bad_eos = with_config("bad_eos", "eos_token_id", 99_999.into());
    let small_vocab = with_config("small_vocab", "vocab_size", 100.into());
    let d = data.display();
    let cases: Vec<(String, &[&str])> = vec![
        (
            format!("custom_reward_function.path={d}/reward_raises.py"),
            // With the sample it raised on: the prompt's file and row, and the response.
            &[
                "reward_raises.py: raised an exception",
                ".parquet: row ",
                "scoring the response to this prompt",
            ],
        ),
        (
            format!("custom_reward_function.path={d}/reward_text.py"),
            &[
                "reward_text.py",
                ".parquet: row ",
                "scores must be finite numbers",
            ],
        ),
        (
            format!("custom_reward_function.path={d}/missing.py"),
            &["missing.py: no such file (custom_reward_function.path)"],
        ),
        (
            "data.prompt_key=question".into(),
            &["no column `question` (data.prompt_key)"],
        ),
        (
            format!("data.train_files={d}/string_prompt.parquet"),
            &["row 0: column `prompt` is a string"],
        ),
        (
            "data.max_prompt_length=8 data.filter_overlong_prompts=false".into(),
            &["longer than max_prompt_length = 8"],
        ),
        (
            format!("data.train_files={d}/other_source.parquet custom_reward_function.path=null"),
            &["data_source=\"my_task\""],
        ),
        (
            format!("data.train_files={d}/missing.parquet"),
            &["missing.parquet"],
        ),
        (
            format!("actor_rollout_ref.model.path={}", bad_eos.display()),
            &["`eos_token_id` 99999 is outside its vocabulary"],
        ),
        (
            format!("actor_rollout_ref.model.path={}", small_vocab.display()),
            &["outside the vocabulary (100)"],
        ),
        (
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16".into(),
            &["\"V006\""],
        ),
    ];
    for (overrides, causes) in &cases {
        let extra: Vec<String> = overrides.split(' ').map(str::to_owned).collect();
        // Check's findings are in the JSON report, the trainer's on stderr.
        let (code, stdout, stderr) = smoke_config(&config, &extra);
        let all = format!("{stdout}{stderr}");
        assert_eq!(code, Some(1), "{overrides}: {all}");
        for cause in *causes {
            assert!(all.contains(cause), "{overrides}: no `{cause}` in\n{all}");
        }
    }
}

/// An SFT run of verl's `sft_trainer_engine` on a 7B-shaped model without weights and a
/// `messages` parquet smokes on CPU (a scaled stand-in of the model, its own tokenizer and chat
/// template, the file's conversations); a file whose rows lack the messages column is reported
/// with the file and row.
#[test]
fn an_sft_run_smokes_on_cpu_and_bad_conversations_are_reported() {
    let Some(python) = python() else { return };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smoke-sft");
    let _ = std::fs::remove_dir_all(&dir);
    let model = dir.join("model");
    model_dir(&python, &model);
    let script = r#"
import sys, pyarrow as pa, pyarrow.parquet as pq
out = sys.argv[1]
def conv(i):
    return [{"role": "user", "content": f"reverse the digits {i}"},
            {"role": "assistant", "content": str(i)[::-1]}]
pq.write_table(pa.Table.from_pylist([{"messages": conv(1000 + i)} for i in range(32)]), f"{out}/train.parquet")
pq.write_table(pa.Table.from_pylist([{"messages": conv(2000 + i)} for i in range(8)]), f"{out}/test.parquet")
pq.write_table(pa.Table.from_pylist([{"conversation": conv(i)} for i in range(32)]), f"{out}/wrong_column.parquet")
# verl 0.7.0's legacy single-turn layout, as its gsm8k preprocessing writes extra_info.
def qa(i):
    return {"extra_info": {"split": "train", "index": i, "question": f"reverse the digits {i}", "answer": str(i)[::-1]}}
pq.write_table(pa.Table.from_pylist([qa(1000 + i) for i in range(32)]), f"{out}/qa_train.parquet")
pq.write_table(pa.Table.from_pylist([qa(2000 + i) for i in range(8)]), f"{out}/qa_test.parquet")
"#;
    let status = Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(&dir)
        .status()
        .expect("run python");
    assert!(status.success(), "writing the data failed");
    let args = |train: &str| -> Vec<String> {
        vec![
            "--config-name".into(),
            "sft_trainer_engine".into(),
            "--verl-version".into(),
            "0.9.1".into(),
            format!("model.path={}", model.display()),
            format!("data.train_files={}", dir.join(train).display()),
            format!("data.val_files={}", dir.join("test.parquet").display()),
            "optim.lr=1e-4".into(),
        ]
    };
    let (code, stdout, stderr) = verlc_smoke(&args("train.parquet"));
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("json report");
    assert_eq!(report["ok"], true, "{stdout}");
    let subs = report["substituted"].to_string();
    assert!(subs.contains("builtin://scaled?from="), "{subs}");
    let (code, _, stderr) = verlc_smoke(&args("wrong_column.parquet"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("wrong_column.parquet") && stderr.contains("messages"),
        "{stderr}"
    );
    // verl 0.7.0's legacy trainer (`fsdp_sft_trainer`) as its gsm8k example calls it, and the
    // same with a dict key the rows do not have (reported by file and row).
    let legacy = |prompt_key: &str| -> Vec<String> {
        vec![
            "--config-name".into(),
            "sft_trainer".into(),
            "--verl-version".into(),
            "0.7.0".into(),
            format!("model.partial_pretrain={}", model.display()),
            format!(
                "data.train_files={}",
                dir.join("qa_train.parquet").display()
            ),
            format!("data.val_files={}", dir.join("qa_test.parquet").display()),
            "data.prompt_key=extra_info".into(),
            "data.response_key=extra_info".into(),
            format!("data.prompt_dict_keys=[{prompt_key}]"),
            "+data.response_dict_keys=[answer]".into(),
            "optim.lr=1e-4".into(),
        ]
    };
    let (code, stdout, stderr) = verlc_smoke(&legacy("question"));
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("json report");
    assert_eq!(report["ok"], true, "{stdout}");
    let (code, _, stderr) = verlc_smoke(&legacy("query"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("qa_train.parquet") && stderr.contains("`query`"),
        "{stderr}"
    );
}

/// verl's own example scripts (0.7.0's and 0.9.0's) as `scripts/smoke-examples` retargets them
/// (model directories of each Hub model's shape, data in verl's preprocess layouts, files of
/// verl's repository by files of their shape): each call that verl itself accepts and whose
/// family verlc implements checks, is planned and builds a spec (`smoke --plan`), at least 90%
/// of them, and the ones that do not are refusals at a key. The full runs (every call trained,
/// validated, saved and resumed) are `scripts/smoke-examples` without `--plan`
/// (docs/smoke.md lists their last result).
/// The calls in scope that `verlc build` refuses at a key (docs/smoke.md lists them with the
/// reason): any other call that does not plan is a regression.
const REFUSED_CALLS: [&str; 4] = [
    "examples/grpo_trainer/run_qwen2-7b_math_megatron_lora.sh",
    "examples/grpo_trainer/run_qwen3moe-30b_megatron_lora.sh",
    "examples/tuning/lora/run_qwen3_30b_a3b_megatron.sh",
    "examples/router_replay/run_qwen30_a3b_megatron_vllm.sh",
];

#[test]
fn verl_examples_plan_through_smoke() {
    let Some(python) = python() else { return };
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smoke-examples-plan");
    let _ = std::fs::remove_dir_all(&out);
    // The pass rate is the full run's measure (docs/smoke.md); here every failing call must be
    // a known refusal.
    let run = Command::new(python)
        .arg(checkout().join("scripts/smoke-examples"))
        .args(["--plan", "--jobs", "2", "--threshold", "0", "--out"])
        .arg(&out)
        .current_dir(checkout())
        .env("VERLC_BIN", env!("CARGO_BIN_EXE_verlc"))
        .env("NO_COLOR", "1")
        .output()
        .expect("run scripts/smoke-examples");
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let results: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    for release in ["0.7.0", "0.9.0"] {
        let ran = results
            .iter()
            .filter(|r| {
                r["release"] == release && matches!(r["status"].as_str(), Some("pass" | "fail"))
            })
            .count();
        assert!(ran >= 40, "{release}: only {ran} calls in scope\n{text}");
    }
    // A call that does not plan is a known refusal and says why, at a key.
    for r in results.iter().filter(|r| r["status"] == "fail") {
        let first = r["problems"][0].as_str().unwrap_or_default();
        assert!(first.contains('`') || first.contains(' '), "{r}");
        let script = r["script"].as_str().unwrap_or_default();
        assert!(
            REFUSED_CALLS.contains(&script),
            "{script} does not plan: {first}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}
