//! The binding matrix end to end (issue 6): for every strategy × precision in the support
//! table (`verlc_front::plan::binding::supported`), derive a small config from the quickstart of its
//! strategy, build the trainer with `verlc build`, and run two training steps for every
//! placement the table supports under it (`supported_offload`), the offload keys given to the
//! binary as run-time overrides: placement is data of the spec, so one binary runs them all.
//! Each run checks what came out: the binding in the build report and in the binary's
//! start-up banner, exit status 0, two steps of metrics in the JSONL file logger and the
//! step-2 checkpoint.
//!
//! Besides the one-rank runs, per binding the placement that offloads the most runs again over
//! two ranks (CPU processes over Gloo, spawned by the trainer itself): FSDP data parallel over
//! 2 ranks, Megatron with tensor parallelism 2 (world size and TP are run-time overrides too).
//! Runs that the runtime cannot do yet are listed in [`KNOWN_GAPS`] with the error they must
//! fail with.
//!
//! Cost: every binding is its own crate and binary, built one after another by `verlc build`
//! into the workspace's target directory (the runtime is compiled once; a binding costs its
//! small crate and a link, and nothing on a rerun). Runs overlap with the next builds.
//! With `VERLC_EXPECT_SHARED_TARGET=1` (set by `scripts/test`) a build that compiles a
//! dependency the workspace already compiled (tch, tokenizers, ...) fails the test.
//! Skipped when no libtorch is available (no `.venv` from scripts/setup and no `LIBTORCH`).
//! `cargo test -p verlc --test build_matrix -- --nocapture` prints the matrix.

use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use verlc_front::plan::binding::{self, Dtype, StrategyKind};
use verlc_front::plan::{Binding, OffloadFlags};

const ACTOR: &str = "actor_rollout_ref.actor";

/// A tiny model: one layer, hidden 32, 2 heads sharing 1 KV head.
const TINY_MODEL: &str = "builtin://tiny?layers=1&hidden=32&heads=2&kv_heads=1";
/// The same with a KV head per attention head: tensor parallelism 2 splits the KV heads.
const TINY_MODEL_TP2: &str = "builtin://tiny?layers=1&hidden=32&heads=2&kv_heads=2";

/// Overrides (on top of the quickstart) that make two steps small and fast, on one or two
/// ranks: 4 prompts × 2 samples, mini-batches of 2 prompts, micro-batches of 2 samples, no
/// validation, a checkpoint at step 2, metrics to the JSONL file logger only.
fn small_run() -> Vec<String> {
    [
        format!("actor_rollout_ref.model.path='{TINY_MODEL}'"),
        "data.train_batch_size=4".into(),
        "data.max_response_length=4".into(),
        "actor_rollout_ref.rollout.n=2".into(),
        format!("{ACTOR}.ppo_mini_batch_size=2"),
        format!("{ACTOR}.ppo_micro_batch_size_per_gpu=2"),
        format!("{ACTOR}.ppo_epochs=1"),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4".into(),
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4".into(),
        "trainer.total_training_steps=2".into(),
        "trainer.val_before_train=false".into(),
        "trainer.test_freq=-1".into(),
        "trainer.save_freq=2".into(),
        "trainer.logger=[file]".into(),
    ]
    .into()
}

/// The example and the overrides whose plan is `b`, from the keys `verlc_front::plan` reads (its
/// module docs); `None` when no config key selects it. Only the actor's engine section is
/// set: the quickstarts have neither a critic nor a reference policy (which would have to
/// agree, B010/B011).
fn config_for(b: Binding) -> Option<(&'static str, Vec<String>)> {
    match b.strategy {
        StrategyKind::Fsdp => {
            let dtype = b.precision.name();
            let f = format!("{ACTOR}.fsdp_config");
            Some((
                "examples/quickstart.yaml",
                vec![format!("++{f}.mixed_precision.param_dtype={dtype}")],
            ))
        }
        StrategyKind::Megatron => {
            // verl's `megatron.dtype` is bfloat16 or float16; float32 is verlc's extension.
            let dtype = match b.precision {
                Dtype::Fp32 => "float32",
                Dtype::Bf16 => "bfloat16",
                Dtype::Fp16 => "float16",
            };
            let m = format!("{ACTOR}.megatron");
            Some((
                "examples/quickstart_megatron.yaml",
                vec![format!("{m}.dtype={dtype}")],
            ))
        }
    }
}

/// The run-time overrides that place the actor's state as `o` (`None` when no config key
/// selects `o` under the strategy).
fn offload_overrides(strategy: StrategyKind, o: OffloadFlags) -> Option<Vec<String>> {
    match strategy {
        StrategyKind::Fsdp => {
            // `param_offload` moves parameters and their gradients; nothing moves one alone.
            if o.params != o.grads {
                return None;
            }
            let f = format!("{ACTOR}.fsdp_config");
            Some(vec![
                format!("{f}.param_offload={}", o.params),
                format!("{f}.optimizer_offload={}", o.optimizer),
            ])
        }
        StrategyKind::Megatron => {
            let m = format!("{ACTOR}.megatron");
            Some(vec![
                format!("{m}.param_offload={}", o.params),
                format!("{m}.grad_offload={}", o.grads),
                format!("{m}.optimizer_offload={}", o.optimizer),
            ])
        }
    }
}

/// The ranks of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum World {
    One,
    /// Two data-parallel ranks.
    Dp2,
    /// Two ranks, tensor parallelism 2 (Megatron).
    Tp2,
}

impl World {
    fn overrides(self) -> Vec<String> {
        match self {
            World::One => vec![],
            World::Dp2 => vec!["trainer.n_gpus_per_node=2".into()],
            World::Tp2 => vec![
                "trainer.n_gpus_per_node=2".into(),
                format!("{ACTOR}.megatron.tensor_model_parallel_size=2"),
                format!("actor_rollout_ref.model.path='{TINY_MODEL_TP2}'"),
            ],
        }
    }

    fn label(self) -> &'static str {
        match self {
            World::One => "1",
            World::Dp2 => "2 (DP)",
            World::Tp2 => "2 (TP=2)",
        }
    }
}

/// A run that fails today for a known reason in the runtime, outside this test. While its
/// entry is here the run must fail with `error` — or pass, once the runtime has caught up (the
/// table then says the entry is stale and can go); any other outcome fails the test. A binding
/// whose one-rank run is a known gap also runs on two data-parallel ranks, so it trains
/// somewhere.
struct KnownGap {
    applies: fn(Binding, OffloadFlags, World) -> bool,
    error: &'static str,
}

/// The known gaps (each reported to the runtime's owners); none today.
const KNOWN_GAPS: &[KnownGap] = &[];

fn known_gap(b: Binding, o: OffloadFlags, w: World) -> Option<&'static KnownGap> {
    KNOWN_GAPS.iter().find(|g| (g.applies)(b, o, w))
}

/// One binding to build, with its runs (a placement and a world each).
struct Row {
    binding: Binding,
    example: &'static str,
    overrides: Vec<String>,
    runs: Vec<(OffloadFlags, World)>,
}

/// A supported binding or placement that no config key selects.
#[derive(Clone, Copy)]
struct Unreachable {
    binding: Binding,
    offload: Option<OffloadFlags>,
}

/// Every supported binding a config can ask for with its placements, and what no config can
/// ask for.
fn matrix() -> (Vec<Row>, Vec<Unreachable>) {
    let mut rows = Vec::new();
    let mut unreachable = Vec::new();
    for b in binding::supported() {
        let Some((example, overrides)) = config_for(b) else {
            unreachable.push(Unreachable {
                binding: b,
                offload: None,
            });
            continue;
        };
        let placements: Vec<OffloadFlags> = binding::supported_offload(b).collect();
        let mut runs = Vec::new();
        for &o in &placements {
            if offload_overrides(b.strategy, o).is_none() {
                unreachable.push(Unreachable {
                    binding: b,
                    offload: Some(o),
                });
                continue;
            }
            runs.push((o, World::One));
            if known_gap(b, o, World::One).is_some() {
                runs.push((o, World::Dp2));
            }
        }
        // The placement that offloads the most also runs on 2 ranks.
        let reachable = placements
            .iter()
            .filter(|o| offload_overrides(b.strategy, **o).is_some());
        if let Some(&widest) = reachable.max_by_key(|o| o.targets().count()) {
            runs.push((
                widest,
                if b.strategy == StrategyKind::Megatron {
                    World::Tp2
                } else {
                    World::Dp2
                },
            ));
        }
        rows.push(Row {
            binding: b,
            example,
            overrides,
            runs,
        });
    }
    (rows, unreachable)
}

fn checkout() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
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

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `verlc build` of one row into `out`; the binary's path or why not.
fn build(row: &Row, out: &Path, cache: &Path) -> Result<PathBuf, String> {
    let binary = out.join("trainer");
    let res = Command::new(env!("CARGO_BIN_EXE_verlc"))
        .current_dir(checkout())
        .env("NO_COLOR", "1")
        .arg("build")
        // The matrix offloads gradients, which only verl 0.7's Megatron engine can say.
        .args(["--verl-version", "0.7.0"])
        .arg(row.example)
        .args(small_run())
        .args(&row.overrides)
        .arg("-o")
        .arg(&binary)
        .arg("--cache-dir")
        .arg(cache)
        .arg("--target-dir")
        .arg(workspace_target())
        .arg("--json")
        .output()
        .map_err(|e| format!("cannot run verlc: {e}"))?;
    let stderr = String::from_utf8_lossy(&res.stderr);
    if !res.status.success() {
        return Err(format!(
            "verlc build failed ({}):\n{}",
            res.status,
            tail(&stderr, 40)
        ));
    }
    let want = format!("({}; config", row.binding);
    if !stderr
        .lines()
        .any(|l| l.starts_with("built ") && l.contains(&want))
    {
        return Err(format!(
            "verlc build did not report `{}`:\n{}",
            row.binding,
            tail(&stderr, 10)
        ));
    }
    let report: serde_json::Value = serde_json::from_slice(&res.stdout)
        .map_err(|e| format!("verlc build --json printed no report: {e}"))?;
    let compiled: Vec<&str> = report["compiled"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c.as_str()).collect())
        .unwrap_or_default();
    // The checkout's own crates are compiled once more for the generated crates: cargo hashes
    // a path dependency by its path relative to the workspace root, which differs between the
    // verlc workspace and a generated crate's (all generated crates share that one copy).
    let ours = [
        "verlc@",
        "verlc-front@",
        "verlc-spec@",
        "verlc-hub@",
        "verlc-runtime@",
        "verlc-macros@",
    ];
    let shared: Vec<&&str> = compiled
        .iter()
        .filter(|c| !c.starts_with("verlc-trainer-") && !ours.iter().any(|o| c.starts_with(o)))
        .collect();
    if std::env::var_os(SHARED_TARGET_ENV).is_some() && !shared.is_empty() {
        return Err(format!(
            "the trainer build compiled {} crate(s) that the workspace's test build should \
             have compiled already (a second variant: features or profile differ between \
             the workspace and templates/Cargo.toml.j2): {shared:?}",
            shared.len()
        ));
    }
    Ok(binary)
}

/// Set by `scripts/test`, which builds the whole workspace's tests before any test runs: every
/// trainer build must then compile only its own generated crate (and, the first time, the
/// checkout's crates), reusing tch and every other dependency from the workspace's target
/// directory. (Unset when this test runs alone, with only
/// part of the workspace built.)
const SHARED_TARGET_ENV: &str = "VERLC_EXPECT_SHARED_TARGET";

/// Environment of an outer launcher that would make the trainer one rank of someone else's
/// world.
const LAUNCHER_ENV: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
];

/// How long one run may take before it is killed (a hung rendezvous must not hang CI).
const RUN_LIMIT: Duration = Duration::from_secs(180);

/// Runs the trainer in `dir` (its own process group, killed after [`RUN_LIMIT`]); exit code
/// and stderr.
fn run_trainer(
    binary: &Path,
    dir: &Path,
    args: &[String],
) -> Result<(Option<i32>, String), String> {
    use std::os::unix::process::CommandExt;
    let stderr_path = dir.join("stderr.txt");
    let mut cmd = Command::new(binary);
    cmd.current_dir(dir)
        .args(args)
        .env("VERL_FILE_LOGGER_PATH", dir.join("metrics.jsonl"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(File::create(dir.join("stdout.txt")).map_err(|e| e.to_string())?)
        .stderr(File::create(&stderr_path).map_err(|e| e.to_string())?)
        .process_group(0);
    for k in LAUNCHER_ENV {
        cmd.env_remove(k);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(s);
        }
        if start.elapsed() > RUN_LIMIT {
            // The whole group: the trainer and the ranks it spawned.
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(format!("-{}", child.id()))
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    match status {
        Some(s) => Ok((s.code(), stderr)),
        None => Err(format!(
            "killed after {} s:\n{}",
            RUN_LIMIT.as_secs(),
            tail(&stderr, 20)
        )),
    }
}

/// What a finished run logged: the steps and, per step, whether the optimizer skipped it
/// (fp16 loss scaling: `actor/grad_norm` is null when the gradients overflowed).
fn check_outputs(b: Binding, dir: &Path) -> Result<usize, String> {
    let path = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("no metrics at {}: {e}", path.display()))?;
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let steps: Vec<Option<u64>> = lines.iter().map(|l| l["step"].as_u64()).collect();
    if steps != [Some(1), Some(2)] {
        return Err(format!("logged steps {steps:?}, want [1, 2]"));
    }
    let mut skipped = 0;
    for l in &lines {
        let step = &l["step"];
        let data = &l["data"];
        for key in [
            "actor/pg_loss",
            "actor/entropy",
            "critic/score/mean",
            "perf/time_per_step",
        ] {
            if !data[key].as_f64().is_some_and(f64::is_finite) {
                return Err(format!(
                    "step {step}: `{key}` is {}, want a finite number",
                    data[key]
                ));
            }
        }
        match data["actor/grad_norm"].as_f64() {
            Some(g) if g.is_finite() => {}
            None if data["actor/grad_norm"].is_null() && b.precision.loss_scaling() => skipped += 1,
            _ => {
                return Err(format!(
                    "step {step}: `actor/grad_norm` is {}",
                    data["actor/grad_norm"]
                ));
            }
        }
    }
    let ckpt = dir.join("ckpt");
    let tracker =
        std::fs::read_to_string(ckpt.join("latest_checkpointed_iteration.txt")).unwrap_or_default();
    if tracker.trim() != "2" || !ckpt.join("global_step_2/actor").is_dir() {
        return Err(format!(
            "no step-2 checkpoint in {} (tracker {tracker:?})",
            ckpt.display()
        ));
    }
    Ok(skipped)
}

/// One run of a built binding with placement `o`: its verdict (`Err` is a failure of the
/// test).
fn run_row(
    b: Binding,
    o: OffloadFlags,
    binary: &Path,
    world: World,
    dir: &Path,
) -> Result<String, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut args = vec![format!(
        "trainer.default_local_dir={}",
        dir.join("ckpt").display()
    )];
    args.extend(offload_overrides(b.strategy, o).unwrap_or_default());
    args.extend(world.overrides());
    let (code, stderr) = run_trainer(binary, dir, &args)?;
    let banner = format!(
        "verlc trainer: built by verlc {}",
        env!("CARGO_PKG_VERSION")
    );
    if !stderr
        .lines()
        .any(|l| l.starts_with(&banner) && l.ends_with(&format!("; {b}")))
    {
        return Err(format!(
            "no start-up banner with `{b}`:\n{}",
            tail(&stderr, 20)
        ));
    }
    let gap = known_gap(b, o, world);
    match (code, gap) {
        (Some(0), _) => {}
        (Some(1), Some(gap)) if stderr.contains(gap.error) => {
            return Ok(format!("known gap: {}", gap.error));
        }
        (_, Some(gap)) => {
            return Err(format!(
                "exit {code:?}, but the known gap is `{}`:\n{}",
                gap.error,
                tail(&stderr, 20)
            ));
        }
        (_, None) => return Err(format!("exit {code:?}:\n{}", tail(&stderr, 20))),
    }
    let skipped = check_outputs(b, dir)?;
    let mut verdict = String::from("ok");
    if skipped > 0 {
        verdict.push_str(&format!(" ({skipped}/2 steps skipped by the loss scaler)"));
    }
    if gap.is_some() {
        verdict.push_str("; its KNOWN_GAPS entry is stale, remove it");
    }
    Ok(verdict)
}

struct Line {
    binding: Binding,
    offload: Option<OffloadFlags>,
    world: &'static str,
    verdict: Result<String, String>,
    build_s: f64,
    run_s: Option<f64>,
}

/// The binding is static: a binary holds the engine code of its bound strategy only (the
/// other strategy's engine is never monomorphized, so none of its symbols are linked), and
/// loss-scaling code only when its precision is fp16 (the precision marker supplies the
/// scaler; fp32 and bf16 binaries never reference it).
fn only_bound_code(b: Binding, binary: &Path) -> Result<(), String> {
    let out = std::process::Command::new("nm")
        .arg("--demangle")
        .arg("--defined-only")
        .arg(binary)
        .output()
        .map_err(|e| format!("cannot run nm: {e}"))?;
    let symbols = String::from_utf8_lossy(&out.stdout);
    let count = |needle: &str| symbols.lines().filter(|l| l.contains(needle)).count();
    let (megatron, fsdp, scaler) = (
        count("megatron::engine::MegatronEngine"),
        count("engine::fsdp::FsdpEngine"),
        count("optim::scaler::GradScaler"),
    );
    match b.strategy {
        StrategyKind::Fsdp if megatron > 0 => {
            return Err(format!(
                "an FSDP binary holds {megatron} Megatron engine symbols"
            ));
        }
        StrategyKind::Megatron if fsdp > 0 => {
            return Err(format!(
                "a Megatron binary holds {fsdp} FSDP engine symbols"
            ));
        }
        StrategyKind::Megatron if megatron == 0 => {
            return Err(
                "a Megatron binary holds no Megatron engine symbols (nm found none)".into(),
            );
        }
        _ => {}
    }
    match (b.precision.loss_scaling(), scaler) {
        (false, n) if n > 0 => Err(format!(
            "a {:?} binary holds {n} grad scaler symbols",
            b.precision
        )),
        (true, 0) => Err("an fp16 binary holds no grad scaler symbols (nm found none)".into()),
        _ => Ok(()),
    }
}

#[test]
fn every_supported_binding_builds_and_trains_two_steps() {
    if !libtorch_available() {
        verlc_testkit::missing_data("no libtorch (scripts/setup installs torch, or set LIBTORCH)");
        return;
    }
    let start = Instant::now();
    let (rows, unreachable) = matrix();
    assert!(
        rows.iter().any(|r| r.binding.strategy == StrategyKind::Fsdp
            && r.runs.iter().any(|(_, w)| *w == World::Dp2)),
        "a 2-rank FSDP run"
    );
    assert!(
        rows.iter()
            .any(|r| r.runs.iter().any(|(_, w)| *w == World::Tp2)),
        "a Megatron TP=2 run"
    );
    for p in Dtype::ALL {
        assert!(
            rows.iter()
                .any(|r| r.binding.strategy == StrategyKind::Fsdp && r.binding.precision == p),
            "FSDP {p:?} in the matrix"
        );
    }

    let work = tempfile::tempdir().expect("temp dir");
    // A stable cache: a rerun finds every generated crate fresh.
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verlc-build-matrix");
    let mut lines = Vec::new();
    std::thread::scope(|s| {
        // Builds one after another (cargo serializes them anyway) while the runs of the
        // previous bindings go on here.
        let (tx, rx) = mpsc::channel();
        let rows = &rows;
        let (work_dir, cache) = (work.path(), &cache);
        s.spawn(move || {
            for (i, row) in rows.iter().enumerate() {
                let out = work_dir.join(format!("{i:02}"));
                let t = Instant::now();
                let built = std::fs::create_dir_all(&out)
                    .map_err(|e| e.to_string())
                    .and_then(|()| build(row, &out, cache));
                if tx.send((i, built, t.elapsed().as_secs_f64())).is_err() {
                    break;
                }
            }
        });
        for (i, built, build_s) in rx {
            let row = &rows[i];
            let binary = match built {
                Ok(b) => b,
                Err(e) => {
                    lines.push(Line {
                        binding: row.binding,
                        offload: None,
                        world: "-",
                        verdict: Err(e),
                        build_s,
                        run_s: None,
                    });
                    continue;
                }
            };
            if let Err(e) = only_bound_code(row.binding, &binary) {
                lines.push(Line {
                    binding: row.binding,
                    offload: None,
                    world: "-",
                    verdict: Err(e),
                    build_s,
                    run_s: None,
                });
            }
            for (j, &(offload, world)) in row.runs.iter().enumerate() {
                let dir = work
                    .path()
                    .join(format!("{i:02}"))
                    .join(format!("run-{j:02}-{world:?}"));
                let t = Instant::now();
                let verdict = run_row(row.binding, offload, &binary, world, &dir);
                lines.push(Line {
                    binding: row.binding,
                    offload: Some(offload),
                    world: world.label(),
                    verdict,
                    build_s,
                    run_s: Some(t.elapsed().as_secs_f64()),
                });
            }
            // 100+ MB each; keep the temp dir small.
            let _ = std::fs::remove_file(&binary);
        }
    });

    let label = |b: Binding, o: Option<OffloadFlags>| match o {
        Some(o) => format!("{b}, offload = {}", o.list()),
        None => b.to_string(),
    };
    let w = lines
        .iter()
        .map(|l| label(l.binding, l.offload))
        .chain(unreachable.iter().map(|u| label(u.binding, u.offload)))
        .map(|s| s.len())
        .max()
        .unwrap_or(0);
    let mut report = String::new();
    let _ = writeln!(
        report,
        "{:<w$} {:<9} {:>7} {:>6}  result",
        "binding, placement", "world", "build s", "run s"
    );
    for l in &lines {
        let verdict = match &l.verdict {
            Ok(v) => v.clone(),
            Err(e) => format!("FAILED: {}", e.lines().next().unwrap_or("")),
        };
        let run_s = l.run_s.map_or("-".into(), |s| format!("{s:.1}"));
        let _ = writeln!(
            report,
            "{:<w$} {:<9} {:>7.1} {:>6}  {verdict}",
            label(l.binding, l.offload),
            l.world,
            l.build_s,
            run_s
        );
    }
    for u in &unreachable {
        let _ = writeln!(
            report,
            "{:<w$} {:<9} {:>7} {:>6}  FAILED: in the support table, but no config key selects it",
            label(u.binding, u.offload),
            "-",
            "-",
            "-"
        );
    }
    let _ = writeln!(
        report,
        "{} builds, {} runs in {:.0} s",
        rows.len(),
        lines.iter().filter(|l| l.run_s.is_some()).count(),
        start.elapsed().as_secs_f64()
    );
    eprintln!("{report}");

    // Every row of the support table builds and runs: a row no config selects is a failure.
    let failures: Vec<String> = lines
        .iter()
        .filter_map(|l| {
            l.verdict.as_ref().err().map(|e| {
                format!(
                    "{} on {} rank(s): {e}",
                    label(l.binding, l.offload),
                    l.world
                )
            })
        })
        .chain(unreachable.iter().map(|u| {
            format!(
                "{}: in the support table, but no config key selects it",
                label(u.binding, u.offload)
            )
        }))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n\n{}\n\n{report}",
        failures.len(),
        lines.len(),
        failures.join("\n\n")
    );
}
