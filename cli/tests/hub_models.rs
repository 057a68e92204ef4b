//! Models named by Hugging Face Hub id: `verlc check` reads a cached model's `config.json` for
//! its model-aware rules, `verlc fetch` prints a cached snapshot and fails clearly offline or
//! without a reachable Hub, and `verlc build` reports a model it cannot get at the key's line
//! before compiling anything. The cache is laid out as `huggingface_hub` writes it (the
//! `verlc-hub` crate's tests compare that layout with huggingface_hub and transformers).

use std::path::{Path, PathBuf};
use std::process::Command;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn checkout() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// verlc with a Hub cache at `cache`, offline unless the test says otherwise.
fn verlc(cache: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_verlc"));
    cmd.current_dir(checkout())
        .env("NO_COLOR", "1")
        .env("VERLC_PYTHON", "")
        .env("HF_HUB_CACHE", cache)
        .env("HF_HUB_OFFLINE", "1")
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN");
    cmd
}

fn run(cmd: &mut Command) -> (Option<i32>, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `models--org--qwen-dims` at `main`: Qwen2.5-0.5B's head counts (14 query, 2 key/value).
fn cache_with_model(root: &Path) -> PathBuf {
    let repo = root.join("models--org--qwen-dims");
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(
        repo.join("blobs/cfg"),
        r#"{"model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14,
            "num_key_value_heads": 2, "num_hidden_layers": 24, "vocab_size": 151936,
            "intermediate_size": 4864, "max_position_embeddings": 32768}"#,
    )
    .unwrap();
    std::os::unix::fs::symlink("../../blobs/cfg", snap.join("config.json")).unwrap();
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
    snap
}

#[test]
fn check_reads_the_config_of_a_cached_hub_model() {
    let dir = tempfile::tempdir().unwrap();
    cache_with_model(dir.path());
    let args = [
        "check",
        "examples/quickstart.yaml",
        "actor_rollout_ref.model.path=org/qwen-dims",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        "trainer.n_gpus_per_node=4",
    ];
    let (_, _, stderr) = run(verlc(dir.path()).args(args));
    assert!(
        stderr.contains("num_attention_heads = 14"),
        "the model-aware rules read the cached config.json: {stderr}"
    );
    // Not in this cache: nothing to read, no finding about the heads (and no error either:
    // verl would download it).
    let empty = tempfile::tempdir().unwrap();
    let (_, _, stderr) = run(verlc(empty.path()).args(args));
    assert!(!stderr.contains("num_attention_heads"), "{stderr}");
}

#[test]
fn fetch_prints_a_cached_snapshot_and_fails_clearly_without_the_hub() {
    let dir = tempfile::tempdir().unwrap();
    let snap = cache_with_model(dir.path());
    let (code, stdout, stderr) = run(verlc(dir.path()).args(["fetch", "org/qwen-dims"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), snap.display().to_string());

    let (code, _, stderr) = run(verlc(dir.path()).args(["fetch", "org/absent"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("org/absent") && stderr.contains("HF_HUB_OFFLINE"),
        "{stderr}"
    );

    // Online, but the Hub does not answer (nothing listens on port 9 here).
    let (code, _, stderr) = run(verlc(dir.path())
        .args(["fetch", "org/absent"])
        .env_remove("HF_HUB_OFFLINE")
        .env("HF_ENDPOINT", "http://127.0.0.1:9"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot download `org/absent` from http://127.0.0.1:9"),
        "{stderr}"
    );
    let (code, _, stderr) = run(verlc(dir.path()).args(["fetch", "not a/valid/id"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("not a Hugging Face Hub model id"),
        "{stderr}"
    );
}

#[test]
fn build_reports_an_unavailable_hub_model_at_its_line_before_compiling() {
    let dir = tempfile::tempdir().unwrap();
    let quickstart = std::fs::read_to_string(checkout().join("examples/quickstart.yaml")).unwrap();
    let text = quickstart.replacen(
        "    path: builtin://tiny?layers=2&hidden=128\n",
        "    path: org/absent\n",
        1,
    );
    assert_ne!(
        text, quickstart,
        "the quickstart names its model on one line"
    );
    let cfg = dir.path().join("hub.yaml");
    std::fs::write(&cfg, &text).unwrap();
    let line = text
        .lines()
        .position(|l| l.contains("org/absent"))
        .map_or(0, |i| i + 1);
    let (code, _, stderr) = run(verlc(dir.path())
        .arg("build")
        .arg(&cfg)
        .arg("-o")
        .arg(dir.path().join("t"))
        .env("VERLC_CACHE_DIR", dir.path().join("cache")));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("error[B019]"), "{stderr}");
    assert!(stderr.contains(&format!("hub.yaml:{line}:")), "{stderr}");
    assert!(
        !stderr.contains("compiling"),
        "nothing is compiled: {stderr}"
    );
    assert!(!dir.path().join("t").exists());
}

// A family the trainer's decoder does not implement, a Qwen3-MoE checkpoint with Megatron
// expert parallelism over more ranks than its data-parallel size (or, with whole experts,
// than its tensor x data-parallel ranks), a Qwen3.5 under a Megatron
// tensor parallel degree or a Ulysses degree that does not divide its Gated DeltaNet heads (3
// key heads here; both split them as they split attention heads) are
// refused by `verlc build` at the key that names the model, before compiling: the trainer
// never finds out at start-up.
#[test]
fn build_refuses_a_model_the_bound_strategy_does_not_run() {
    let ulysses: &[&str] = &[
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    ];
    for (example, model_type, strategy, extra, why) in [
        (
            "quickstart.yaml",
            "deepseek_v3",
            "fsdp",
            &[][..],
            "verlc's models are",
        ),
        (
            "quickstart_megatron.yaml",
            "qwen3_moe",
            "megatron",
            &["actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"],
            "expert_model_parallel_size = 2 over 1 context x data-parallel ranks",
        ),
        (
            "quickstart_megatron.yaml",
            "qwen3_moe",
            "megatron",
            &[
                "trainer.n_gpus_per_node=2",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
                "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4",
            ],
            "expert_model_parallel_size = 4 over 2 tensor x context x data-parallel ranks",
        ),
        (
            "quickstart_megatron.yaml",
            "qwen3_5_text",
            "megatron",
            &[
                "trainer.n_gpus_per_node=2",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            ],
            "tensor parallel 2 over its Gated DeltaNet layers' 3 key and 6 value heads",
        ),
        (
            "quickstart.yaml",
            "qwen3_5_text",
            "fsdp",
            ulysses,
            "Ulysses of degree 2 must divide both",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("the-model");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(
            model.join("config.json"),
            format!(
                r#"{{"model_type": "{model_type}", "hidden_size": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100,
                "intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2,
                "moe_intermediate_size": 32, "linear_num_key_heads": 3,
                "linear_num_value_heads": 6}}"#
            ),
        )
        .unwrap();
        let text = std::fs::read_to_string(checkout().join("examples").join(example)).unwrap();
        let text = text.replacen(
            "    path: builtin://tiny?layers=2&hidden=128\n",
            &format!("    path: {}\n", model.display()),
            1,
        );
        let cfg = dir.path().join("model.yaml");
        std::fs::write(&cfg, &text).unwrap();
        let line = text
            .lines()
            .position(|l| l.contains("the-model"))
            .map_or(0, |i| i + 1);
        let (code, _, stderr) = run(verlc(dir.path())
            .arg("build")
            .arg(&cfg)
            .arg(format!("actor_rollout_ref.actor.strategy={strategy}"))
            .args(extra)
            .arg("-o")
            .arg(dir.path().join("t"))
            .env("VERLC_CACHE_DIR", dir.path().join("cache")));
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("error[B018]"), "{stderr}");
        assert!(
            stderr.contains(model_type) && stderr.contains(why),
            "{stderr}"
        );
        assert!(stderr.contains(&format!("model.yaml:{line}:")), "{stderr}");
        assert!(!stderr.contains("compiling"), "{stderr}");
    }
}

// A local model path that is no directory (verl's default `~/models/...` paths: `~` is not
// expanded) is refused by `verlc build` at its key, before compiling.
#[test]
fn build_refuses_a_model_path_that_is_no_directory() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(checkout().join("examples/quickstart.yaml")).unwrap();
    let cfg = dir.path().join("missing.yaml");
    std::fs::write(&cfg, &text).unwrap();
    let (code, _, stderr) = run(verlc(dir.path())
        .arg("build")
        .arg(&cfg)
        .arg("algorithm.adv_estimator=gae")
        .arg("critic.ppo_micro_batch_size_per_gpu=16")
        .arg("+critic.fsdp.mixed_precision.param_dtype=fp32")
        .arg("-o")
        .arg(dir.path().join("t"))
        .env("VERLC_CACHE_DIR", dir.path().join("cache")));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("error[B019]"), "{stderr}");
    assert!(stderr.contains("no such directory"), "{stderr}");
    assert!(
        stderr.contains("<verl 0.9.1>/model/hf_model.yaml:3:"),
        "{stderr}"
    );
    assert!(!stderr.contains("compiling"), "{stderr}");
}

// vLLM's CPU attention serves heads of 32 or more only (a narrower head fails its first
// request): `rollout.name=vllm` with such a policy on a CPU device is refused by `verlc build`
// at `rollout.name`, for a builtin model and a checkpoint directory alike; 32 wide passes.
#[test]
fn build_refuses_vllm_on_cpu_with_heads_narrower_than_32() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("narrow");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(
        model.join("config.json"),
        r#"{"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100,
            "intermediate_size": 128}"#,
    )
    .unwrap();
    let text = std::fs::read_to_string(checkout().join("examples/quickstart.yaml")).unwrap();
    let text = text.replace("    name: verlc\n", "    name: vllm\n");
    let cfg = dir.path().join("vllm.yaml");
    std::fs::write(&cfg, &text).unwrap();
    let line = text
        .lines()
        .position(|l| l.contains("name: vllm"))
        .map_or(0, |i| i + 1);
    for (path, head) in [
        ("builtin://tiny?layers=2&hidden=64&heads=4".to_owned(), 16),
        (model.display().to_string(), 16),
    ] {
        let (code, _, stderr) = run(verlc(dir.path())
            .arg("build")
            .arg(&cfg)
            .arg(format!("actor_rollout_ref.model.path='{path}'"))
            .arg("-o")
            .arg(dir.path().join("t"))
            .env("VERLC_CACHE_DIR", dir.path().join("cache")));
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("error[B018]"), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "head dimension of at least 32; `{path}` has {head}"
            )),
            "{stderr}"
        );
        assert!(stderr.contains(&format!("vllm.yaml:{line}:")), "{stderr}");
        assert!(!stderr.contains("compiling"), "{stderr}");
    }
    // The quickstart's model (32 wide) passes `verlc check`'s model stage too.
    let (code, _, stderr) = run(verlc(dir.path()).arg("check").arg(&cfg));
    assert_eq!(code, Some(0), "{stderr}");
}

/// An SFT config's model is checked the same way before its trainer is compiled: a Hub id
/// missing from an offline cache, or a local path that is no directory, is an error at the
/// key that names it (`model.path`; verl 0.7.0's legacy `model.partial_pretrain`).
#[test]
fn sft_build_reports_an_unavailable_model_at_its_key_before_compiling() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--config-name",
                "sft_trainer_engine",
                "trainer.device=cpu",
                "model.path=org/absent",
            ],
            "org/absent",
        ),
        (
            &[
                "--verl-version",
                "0.7.0",
                "--config-name",
                "sft_trainer",
                "trainer.device=cpu",
                "model.partial_pretrain=/nonexistent/model",
            ],
            "/nonexistent/model",
        ),
    ];
    for (i, (args, named)) in cases.iter().enumerate() {
        let out = dir.path().join(format!("t{i}"));
        let (code, _, stderr) = run(verlc(dir.path())
            .arg("build")
            .args(*args)
            .arg("-o")
            .arg(&out)
            .env("VERLC_CACHE_DIR", dir.path().join("cache")));
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("error[B019]"), "{stderr}");
        assert!(stderr.contains(&format!("the model `{named}`")), "{stderr}");
        assert!(
            !stderr.contains("compiling"),
            "nothing is compiled: {stderr}"
        );
        assert!(!out.exists());
    }
}
