//! `verlc build` end to end: a generated trainer for `examples/quickstart.yaml` prints its
//! config, refuses a run-time override that breaks a rule, and refuses one that changes a
//! statically bound key. Plus the checks `verlc build` does before compiling anything.
//!
//! The trainer links libtorch, so the build test shares the workspace target directory
//! (`$CARGO_TARGET_DIR`, else `target/`): the runtime and tch are reused from the workspace
//! build and a warm run costs the generated crate and a link. It is skipped when no libtorch
//! is available (no `.venv` from scripts/setup and no `LIBTORCH`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn checkout() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

fn verlc() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_verlc"));
    // The user's path: the newest release's built-in tree (no Python's verl decides).
    cmd.current_dir(checkout())
        .env("NO_COLOR", "1")
        .env("VERLC_PYTHON", "");
    cmd
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn run(cmd: &mut Command) -> (Option<i32>, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let (stdout, stderr) = text(&out);
    (out.status.code(), stdout, stderr)
}

fn libtorch_available() -> bool {
    std::env::var_os("LIBTORCH").is_some()
        || std::env::var_os("LIBTORCH_USE_PYTORCH").is_some()
        || checkout().join(".venv/bin/python").is_file()
}

/// The workspace's target directory, shared with the generated crates.
fn workspace_target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| checkout().join("target"))
}

/// `verlc build <args> -o <temp dir>/trainer` with the build cache the tests share (a stable
/// cache keeps the generated crate fresh between runs); asserts it built. Returns the temp
/// dir (alive as long as the caller keeps it), the trainer and the build's stderr.
fn build_trainer(
    args: impl IntoIterator<Item = impl AsRef<std::ffi::OsStr>>,
) -> (tempfile::TempDir, PathBuf, String) {
    let out_dir = tempfile::tempdir().expect("temp dir");
    let trainer = out_dir.path().join("trainer");
    let (code, _, stderr) = run(verlc()
        .arg("build")
        .args(args)
        .arg("-o")
        .arg(&trainer)
        .env("VERLC_CACHE_DIR", build_cache())
        .env("VERLC_TARGET_DIR", workspace_target()));
    assert_eq!(code, Some(0), "verlc build failed:\n{stderr}");
    (out_dir, trainer, stderr)
}

/// The build cache the trainer tests share.
fn build_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("verlc-build-test")
}

#[test]
fn quickstart_trainer_checks_its_run_time_overrides() {
    if !libtorch_available() {
        verlc_testkit::missing_data("no libtorch (scripts/setup installs torch, or set LIBTORCH)");
        return;
    }
    let (out_dir, trainer, stderr) = build_trainer(["examples/quickstart.yaml"]);
    assert!(
        stderr.contains("(strategy = Fsdp, precision = Fp32; config"),
        "{stderr}"
    );
    assert!(trainer.is_file());

    let trainer_cmd = || {
        let mut c = Command::new(&trainer);
        c.current_dir(out_dir.path());
        c
    };

    let (code, stdout, stderr) = run(trainer_cmd().arg("--print-config"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("built by verlc") && stderr.contains("config sha256:"),
        "build info at start-up: {stderr}"
    );
    assert!(stdout.contains("adv_estimator: grpo"), "{stdout}");
    assert!(stdout.contains("total_training_steps: 60"), "{stdout}");

    // The spec the binary embeds is the one lowering produced; an override is lowered the same way.
    let (code, stdout, stderr) = run(trainer_cmd().arg("--print-spec"));
    assert_eq!(code, Some(0), "{stderr}");
    let spec: serde_json::Value = serde_json::from_str(&stdout).expect("spec json");
    assert_eq!(spec["binding"]["strategy"], "Fsdp", "{stdout}");
    assert_eq!(spec["actor"]["optim"]["lr"], 1e-3, "{stdout}");
    assert_eq!(
        spec["actor"]["update"]["ppo_micro_batch_size"], 128,
        "{stdout}"
    );
    let (code, stdout, stderr) =
        run(trainer_cmd().args(["--print-spec", "actor_rollout_ref.actor.optim.lr=1e-5"]));
    assert_eq!(code, Some(0), "{stderr}");
    let spec: serde_json::Value = serde_json::from_str(&stdout).expect("spec json");
    assert_eq!(spec["actor"]["optim"]["lr"], 1e-5, "{stdout}");
    // An override the binary cannot honour is refused before anything runs (B018), not at start-up.
    let (code, _, stderr) =
        run(trainer_cmd().args(["--check", "trainer.logger=[console,swanlab]"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error[B018]") && stderr.contains("swanlab"),
        "{stderr}"
    );

    // A run-time override is checked by verlc's rules (V002: a mini-batch beyond the step),
    // against the release the binary was built for.
    let (code, stdout, stderr) = run(trainer_cmd().args([
        "--print-config",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1000",
    ]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("error[V002]") && stderr.contains("more than the 64 prompts"),
        "{stderr}"
    );
    // A key verl 0.9 moved is named with where it went: the binary judges against the release
    // it was built for (0.9.1), not verlc's 0.7.0 tree.
    let (code, _, stderr) = run(trainer_cmd().args([
        "--print-config",
        "actor_rollout_ref.rollout.skip_rollout=true",
    ]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error[H011]") && stderr.contains("moved it to `skip.rollout.enable`"),
        "{stderr}"
    );

    // A valid one is applied.
    let (code, stdout, stderr) =
        run(trainer_cmd().args(["--print-config", "actor_rollout_ref.actor.optim.lr=1e-5"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("lr: 1e-5") || stdout.contains("lr: 0.00001"),
        "{stdout}"
    );

    // Statically bound keys need a new binary.
    for bound in [
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
        "actor_rollout_ref.actor.strategy=megatron",
    ] {
        let (code, _, stderr) = run(trainer_cmd().args(["--check", bound]));
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("rebuild with verlc"), "{bound}: {stderr}");
    }
    // Placement is data: offload overrides run on the same binary, the actor's and the
    // critic's each their own.
    let placed = [
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "algorithm.adv_estimator=gae",
        "critic.ppo_micro_batch_size_per_gpu=16",
        "critic.fsdp.optimizer_offload=true",
        "+critic.fsdp.mixed_precision.param_dtype=fp32",
        "critic.model.path='builtin://tiny?layers=2&hidden=128'",
    ];
    let (code, stdout, stderr) = run(trainer_cmd().arg("--print-spec").args(placed));
    assert_eq!(code, Some(0), "{stderr}");
    let spec: serde_json::Value = serde_json::from_str(&stdout).expect("spec");
    let engine = |role: &str, key: &str| spec[role]["engine"][key].clone();
    assert_eq!(engine("actor", "param_offload"), true, "{stdout}");
    assert_eq!(engine("critic", "optimizer_offload"), true, "{stdout}");
    assert_eq!(engine("critic", "param_offload"), false, "{stdout}");
    // And trains that way: the actor's optimizer state and the critic's parameters on the host.
    let work = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run(trainer_cmd().current_dir(work.path()).args([
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "algorithm.adv_estimator=gae",
        "critic.ppo_micro_batch_size_per_gpu=16",
        "critic.fsdp.param_offload=true",
        "+critic.fsdp.mixed_precision.param_dtype=fp32",
        "critic.model.path='builtin://tiny?layers=2&hidden=128'",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
    ]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("step:2") && stdout.contains("critic/vf_loss"),
        "{stdout}"
    );
    // A model the trainer cannot load from this machine is refused before any rank starts, at
    // its key: here the critic a run-time override adds, with verl's default path.
    let (code, _, stderr) = run(trainer_cmd().args([
        "--check",
        "algorithm.adv_estimator=gae",
        "critic.ppo_micro_batch_size_per_gpu=16",
        "+critic.fsdp.mixed_precision.param_dtype=fp32",
    ]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error[B019]")
            && stderr.contains(
                "the model `~/models/deepseek-llm-7b-chat` cannot be had: no such directory"
            ),
        "{stderr}"
    );
    // Restating a bound value is harmless.
    let (code, stdout, stderr) = run(trainer_cmd().args([
        "--check",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    ]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("ok: config is valid for this binary"),
        "{stdout}"
    );

    let (code, _, stderr) = run(trainer_cmd().arg("--bogus"));
    assert_eq!(code, Some(2), "{stderr}");

    // `verlc run` reuses the cached build and passes what follows `--` to the trainer.
    let (code, stdout, stderr) = run(verlc()
        .args([
            "run",
            "examples/quickstart.yaml",
            "--",
            "--print-config",
            "trainer.total_training_steps=7",
        ])
        .env("VERLC_CACHE_DIR", build_cache())
        .env("VERLC_TARGET_DIR", workspace_target()));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("total_training_steps: 7"), "{stdout}");
}

/// An SFT config (verl's `sft_trainer_engine`) builds into an SFT trainer: its spec is the
/// SFT spec, its run-time overrides are checked by the SFT rules and lowered the same way, a
/// bound key needs a rebuild, and it trains, validates and saves a Hugging Face model.
#[test]
fn sft_trainer_builds_checks_its_overrides_and_trains() {
    if !libtorch_available() {
        verlc_testkit::missing_data("no libtorch (scripts/setup installs torch, or set LIBTORCH)");
        return;
    }
    let (out_dir, trainer, stderr) = build_trainer(["examples/digits_sft.yaml"]);
    assert!(
        stderr.contains("Supervised fine-tuning") && stderr.contains("precision = Fp32; config"),
        "{stderr}"
    );
    let trainer_cmd = || {
        let mut c = Command::new(&trainer);
        c.current_dir(out_dir.path());
        c
    };
    let (code, stdout, stderr) = run(trainer_cmd().args(["--print-spec", "optim.lr=1e-4"]));
    assert_eq!(code, Some(0), "{stderr}");
    let spec: serde_json::Value = serde_json::from_str(&stdout).expect("spec json");
    assert_eq!(spec["sft"]["model"]["optim"]["lr"], 1e-4, "{stdout}");
    assert_eq!(spec["sft"]["batching"]["global_batch"], 32, "{stdout}");
    // The SFT rules judge overrides (F008: Ulysses groups that do not divide the ranks).
    let (code, _, stderr) =
        run(trainer_cmd().args(["--check", "engine.ulysses_sequence_parallel_size=2"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("error[F008]"), "{stderr}");
    // What the trainer cannot honour is refused before anything runs.
    let (code, _, stderr) = run(trainer_cmd().args(["--check", "engine.strategy=torchtitan"]));
    assert_eq!(code, Some(1), "{stderr}");
    let (code, _, stderr) = run(trainer_cmd().args(["--check", "engine.dtype=bfloat16"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("rebuild with verlc"), "{stderr}");
    let work = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run(trainer_cmd().current_dir(work.path()).args([
        "trainer.total_training_steps=3",
        "trainer.test_freq=3",
        "trainer.n_gpus_per_node=2",
        "data.micro_batch_size_per_gpu=8",
    ]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("step:3") && stdout.contains("train/loss") && stdout.contains("val/loss"),
        "{stdout}"
    );
    let hf = work
        .path()
        .join("checkpoints/digits-sft/tiny/global_step_3/huggingface");
    assert!(hf.join("model.safetensors").is_file(), "{}", hf.display());
}

/// A trainer built from another release's tree (`--config-dir`, verl 0.8.0's, which verlc
/// has no built-in tree of) carries it: its run-time overrides are judged against 0.8.0, whose
/// `rollout.skip` section verl 0.9 moved to the `skip` group.
#[test]
fn a_config_dir_trainer_judges_its_overrides_against_that_tree() {
    let tree = checkout().join(".venv/verl-releases/0.8.0/verl/trainer/config");
    if !libtorch_available() || !tree.is_dir() {
        verlc_testkit::missing_data("no libtorch or no verl 0.8.0 tree (scripts/setup)");
        return;
    }
    let quickstart = std::ffi::OsStr::new("examples/quickstart.yaml");
    let config_dir = std::ffi::OsStr::new("--config-dir");
    let (out_dir, trainer, _) = build_trainer([quickstart, config_dir, tree.as_os_str()]);
    let run_trainer = |args: &[&str]| {
        let mut c = Command::new(&trainer);
        c.current_dir(out_dir.path()).args(args);
        run(&mut c)
    };
    // 0.8.0's key is the trainer's too (on 0.9.1's tree it is an error: moved).
    let (code, stdout, stderr) = run_trainer(&[
        "--print-config",
        "actor_rollout_ref.rollout.skip.enable=false",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("adv_estimator: grpo"), "{stdout}");
    // A key verl added in 0.9.0 is not in this trainer's tree.
    let (code, _, stderr) = run_trainer(&["--check", "trainer.use_v1=false"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error[H011]") && stderr.contains("trainer.use_v1"),
        "{stderr}"
    );
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write config");
    p
}

#[test]
fn unused_keys_warn_and_deny_warnings_stops_the_build() {
    let dir = tempfile::tempdir().expect("temp dir");
    let quickstart =
        std::fs::read_to_string(checkout().join("examples/quickstart.yaml")).expect("quickstart");
    let cfg = write(
        dir.path(),
        "knobs.yaml",
        &quickstart.replace(
            "    temperature: 1.0\n",
            "    temperature: 1.0\n    gpu_memory_utilization: 0.8\n",
        ),
    );
    let line = std::fs::read_to_string(&cfg)
        .expect("read")
        .lines()
        .position(|l| l.contains("gpu_memory_utilization"))
        .map_or(0, |i| i + 1);

    let (code, _, stderr) = run(verlc().arg("build").arg(&cfg).arg("--plan"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("warning[B001]"), "{stderr}");
    assert!(stderr.contains(&format!("knobs.yaml:{line}:")), "{stderr}");

    let (code, _, stderr) = run(verlc()
        .arg("build")
        .arg(&cfg)
        .arg("--deny-warnings")
        .arg("-o")
        .arg(dir.path().join("t")));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error[B001]") && stderr.contains("not building"),
        "{stderr}"
    );
    assert!(!dir.path().join("t").exists());
}

#[test]
fn unsupported_binding_is_reported_at_its_line_by_check_and_build() {
    let dir = tempfile::tempdir().expect("temp dir");
    let quickstart =
        std::fs::read_to_string(checkout().join("examples/quickstart.yaml")).expect("quickstart");
    let cfg = write(
        dir.path(),
        "fp16_offload.yaml",
        // The actor's engine section: fp16 compute with parameter offload.
        &quickstart.replacen(
            "      mixed_precision:\n        param_dtype: fp32\n",
            "      param_offload: true\n      mixed_precision:\n        param_dtype: fp16\n",
            1,
        ),
    );
    let line = std::fs::read_to_string(&cfg)
        .expect("read")
        .lines()
        .position(|l| l.contains("param_dtype: fp16"))
        .map_or(0, |i| i + 1);
    for sub in ["check", "build"] {
        let mut cmd = verlc();
        cmd.arg(sub).arg(&cfg).env("VERLC_CACHE_DIR", dir.path());
        if sub == "build" {
            cmd.arg("--plan");
        }
        let (code, _, stderr) = run(&mut cmd);
        // Valid for verl, so `check` warns; `build` cannot bind it.
        let (want_code, want) = if sub == "check" {
            (0, "warning[B012]")
        } else {
            (1, "error[B012]")
        };
        assert_eq!(code, Some(want_code), "{sub}: {stderr}");
        assert!(stderr.contains(want), "{sub}: {stderr}");
        assert!(
            stderr.contains(&format!("fp16_offload.yaml:{line}:")),
            "{sub}: {stderr}"
        );
        assert!(stderr.contains("Fp16Mixed"), "{sub}: {stderr}");
    }
}

/// Past one machine: the Megatron quickstart's trainer, launched by PyTorch's own `torchrun
/// --no-python` as two "nodes" of two ranks each on loopback (static rendezvous on
/// 127.0.0.1, torchrun's agent serving the store), trains the TP=2 x DP=2 layout.
#[test]
fn torchrun_two_nodes_run_the_tensor_and_data_parallel_layout() {
    let torchrun = checkout().join(".venv/bin/torchrun");
    if !libtorch_available() || !torchrun.is_file() {
        verlc_testkit::missing_data("no torchrun in .venv (scripts/setup installs torch)");
        return;
    }
    let (out_dir, trainer, _) = build_trainer(["examples/quickstart_megatron.yaml"]);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let overrides = [
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
    ];
    let node = |rank: u32| {
        Command::new(&torchrun)
            .args(["--nnodes", "2", "--node-rank", &rank.to_string()])
            .args(["--nproc-per-node", "2", "--master-addr", "127.0.0.1"])
            .args(["--master-port", &port.to_string(), "--no-python"])
            .arg(&trainer)
            .args(overrides)
            .current_dir(out_dir.path())
            .env("OMP_NUM_THREADS", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start torchrun")
    };
    let (n0, n1) = (node(0), node(1));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let mut nodes = [n0, n1];
    while nodes
        .iter_mut()
        .any(|n| n.try_wait().ok().flatten().is_none())
    {
        if std::time::Instant::now() > deadline {
            for n in &mut nodes {
                let _ = n.kill();
            }
            panic!("torchrun nodes did not finish within 300 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let [n0, n1] = nodes;
    let (o0, o1) = (
        n0.wait_with_output().expect("node 0"),
        n1.wait_with_output().expect("node 1"),
    );
    let (out0, err0) = text(&o0);
    let (_, err1) = text(&o1);
    assert!(o0.status.success(), "node 0 failed:\n{err0}");
    assert!(o1.status.success(), "node 1 failed:\n{err1}");
    // Global rank 0 (on node 0) prints verl's console lines.
    assert!(
        out0.contains("step:2"),
        "node 0 printed no step 2:\n{out0}\n{err0}"
    );
}
