//! Hydra parity: verlc's loader must compose verl's config tree the way Hydra 1.3 does.
//!
//! Every case is composed twice, by Hydra (tests/hydra/compose_many.py, run by the
//! project venv's Python, one process per half of the cases) and by
//! `verlc_front::load::compose::load`, and both must agree on the verdict (accepted, or rejected
//! at composition/override/interpolation level) and, when accepted, on the resolved tree.
//! Schema and semantic findings are not part of this comparison: `load` produces none.
//!
//! Cases: the command lines of verl 0.7.0's example launch scripts
//! (tests/fixtures/verl_examples/overrides.json, see its README), verl's two trainer
//! configs without overrides, and hand-written edge cases of the override grammar, group
//! overrides, `hydra.searchpath` extension, interpolation and `???`. The same example
//! overrides are then composed on verlc's built-in default tree and compared with Hydra on
//! verl's tree. Example config dirs of verl (which extend verl's tree) are composed too when
//! a verl git mirror is at hand (`VERL_REPO`); CI has none and skips them. Those dirs, and a
//! user dir that extends verl's tree by `file://verl/trainer/config`, are also composed
//! from a directory without verl, where that search path falls back to the built-in tree.
//! Our own composition tree (tests/fixtures/hydra_composition) covers the defaults-list
//! features verl does not use. verl main's example command lines
//! (tests/fixtures/verl_examples_main) are composed on verl main's own tree
//! (tests/fixtures/verl_trees/main). `VERLC_PARITY_EXTRA=cases.json` adds cases for exploring.
//!
//! Hydra's answers are remembered in tests/hydra/answers.json, keyed by everything Hydra read
//! (see `memo`): a case whose inputs and verlc outcome match a remembered answer is settled
//! without composing it again; Hydra composes every other case. `VERLC_HYDRA_RECORD=1`
//! composes all of them and rewrites the file.
//!
//! Needs `.venv` with hydra-core, omegaconf and verl 0.7.0's config files: `scripts/setup`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{Value, json};
use verlc_front::load::compose::{LoadRequest, load};

#[path = "hydra_parity/memo.rs"]
mod memo;
mod support;
use support::{VERL_MAIN_REF, verl_0_7_0_examples_root, verl_main_tree, workspace, write};

fn venv_python() -> PathBuf {
    let py = workspace().join(".venv/bin/python");
    assert!(
        py.is_file(),
        "Hydra parity needs the project venv ({}) with hydra-core 1.3.2, omegaconf 2.3.0 and verl 0.7.0's \
         config files; run `scripts/setup` (the README's test command does)",
        py.display()
    );
    py
}

/// verl's installed config tree: `.venv/lib/python3.*/site-packages/verl/trainer/config`.
fn verl_config_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("VERLC_VERL_CONFIG_DIR") {
        return PathBuf::from(d);
    }
    let lib = workspace().join(".venv/lib");
    let found = std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .find_map(|e| {
            let d = e.path().join("site-packages/verl/trainer/config");
            d.join("ppo_trainer.yaml").is_file().then_some(d)
        });
    found.unwrap_or_else(|| {
        panic!(
            "verl's config tree is not installed under {}/python3.*/site-packages/verl/trainer/config; \
             run `scripts/setup` (it installs verl==0.7.0 without dependencies)",
            lib.display()
        )
    })
}

#[derive(Clone, Debug)]
struct Case {
    name: String,
    config_dir: PathBuf,
    config_name: String,
    overrides: Vec<String>,
    /// Working directory: relative `file://` search paths resolve against it.
    cwd: Option<PathBuf>,
    /// Also compose these overrides on verlc's built-in tree and compare with Hydra.
    builtin: bool,
}

impl Case {
    fn new(name: impl Into<String>, dir: &Path, config_name: &str, overrides: &[&str]) -> Case {
        Case {
            name: name.into(),
            config_dir: dir.to_path_buf(),
            config_name: config_name.into(),
            overrides: overrides.iter().map(|s| s.to_string()).collect(),
            cwd: None,
            builtin: false,
        }
    }
}

#[derive(Clone, Debug)]
struct Outcome {
    ok: bool,
    error: Option<String>,
    config: Option<Value>,
}

/// Hydra, running: one Python process per half of the cases (CI has two cores).
struct HydraRun {
    children: Vec<(std::process::Child, std::thread::JoinHandle<()>)>,
    expected: usize,
}

fn start_hydra(cases: &[Case]) -> HydraRun {
    let py = venv_python();
    let script = workspace().join("tests/hydra/compose_many.py");
    let input: Vec<Value> = cases
        .iter()
        .map(|c| json!({"config_dir": c.config_dir, "config_name": c.config_name, "overrides": c.overrides, "cwd": c.cwd}))
        .collect();
    if let Some(path) = std::env::var_os("VERLC_PARITY_DUMP") {
        // For checking compose_many.py's memos: `VERLC_HYDRA_NO_MEMO=1 python compose_many.py < dump`.
        std::fs::write(path, serde_json::to_vec(&input).expect("cases serialize"))
            .expect("write the case dump");
    }
    let half = input.len().div_ceil(2).max(1);
    let children = input
        .chunks(half)
        .map(|chunk| {
            let mut child = Command::new(&py)
                .arg(&script)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", py.display()));
            let mut stdin = child.stdin.take().expect("piped stdin");
            let body = serde_json::to_vec(chunk).expect("cases serialize");
            let writer = std::thread::spawn(move || {
                use std::io::Write;
                stdin
                    .write_all(&body)
                    .expect("write cases to compose_many.py");
            });
            (child, writer)
        })
        .collect();
    HydraRun {
        children,
        expected: cases.len(),
    }
}

fn finish_hydra(run: HydraRun) -> Vec<Outcome> {
    let mut out = Vec::new();
    for (child, writer) in run.children {
        let res = child.wait_with_output().expect("compose_many.py runs");
        writer.join().expect("writer thread");
        assert!(
            res.status.success(),
            "compose_many.py failed:\n{}",
            String::from_utf8_lossy(&res.stderr)
        );
        let list: Vec<Value> =
            serde_json::from_slice(&res.stdout).expect("compose_many.py prints JSON");
        out.extend(list.into_iter().map(|v| Outcome {
            ok: v["ok"].as_bool().unwrap_or(false),
            error: v["error"].as_str().map(str::to_string),
            config: (!v["config"].is_null()).then(|| v["config"].clone()),
        }));
    }
    assert_eq!(
        out.len(),
        run.expected,
        "compose_many.py answered every case"
    );
    out
}

fn run_verlc(req: &LoadRequest) -> Outcome {
    let c = load(req);
    let errors: Vec<String> = c
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| {
            format!(
                "{} {} [{}]",
                d.code.0,
                d.message,
                d.key_path.clone().unwrap_or_default()
            )
        })
        .collect();
    Outcome {
        ok: errors.is_empty(),
        error: (!errors.is_empty()).then(|| errors.join("; ")),
        config: Some(c.root.to_json()),
    }
}

fn verlc_on_dir(c: &Case) -> Outcome {
    run_verlc(&LoadRequest {
        config_dir: Some(c.config_dir.clone()),
        config_name: Some(c.config_name.clone()),
        overrides: c.overrides.clone(),
        cwd: c.cwd.clone().unwrap_or_default(),
        builtin: verlc_front::load::version::BuiltinRelease::V0_7_0,
        ..Default::default()
    })
}

/// The same case on verlc's built-in tree: overrides alone (no config dir), or, for a
/// user or example dir that extends verl's tree, that dir run from a directory without
/// `verl/trainer/config`, so its `file://verl/trainer/config` search path falls back to
/// the built-in tree.
fn verlc_on_builtin(c: &Case, verl: &Path) -> Outcome {
    if c.config_dir == verl {
        return run_verlc(&LoadRequest {
            config_name: Some(c.config_name.clone()),
            overrides: c.overrides.clone(),
            builtin: verlc_front::load::version::BuiltinRelease::V0_7_0,
            ..Default::default()
        });
    }
    let elsewhere = scratch().join("without-verl");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    run_verlc(&LoadRequest {
        config_dir: Some(c.config_dir.clone()),
        config_name: Some(c.config_name.clone()),
        overrides: c.overrides.clone(),
        cwd: elsewhere,
        builtin: verlc_front::load::version::BuiltinRelease::V0_7_0,
        ..Default::default()
    })
}

/// Paths where two JSON trees differ (at most `limit`).
fn diff(a: &Value, b: &Value, path: &str, out: &mut Vec<String>, limit: usize) {
    if out.len() >= limit || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) => diff(v, w, &format!("{path}.{k}"), out, limit),
                    None => out.push(format!("{path}.{k}: only in verlc ({v})")),
                }
            }
            for (k, w) in y {
                if !x.contains_key(k) && out.len() < limit {
                    out.push(format!("{path}.{k}: only in Hydra ({w})"));
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                diff(v, w, &format!("{path}[{i}]"), out, limit);
            }
        }
        _ => out.push(format!("{path}: verlc {a} vs Hydra {b}")),
    }
}

/// Compare one case; `None` when verlc agrees with Hydra.
fn compare(name: &str, verlc: &Outcome, hydra: &Outcome) -> Option<String> {
    match (verlc.ok, hydra.ok) {
        (true, true) => {
            let (Some(v), Some(h)) = (&verlc.config, &hydra.config) else {
                return Some(format!("{name}: no tree"));
            };
            let mut d = Vec::new();
            diff(v, h, "", &mut d, 15);
            (!d.is_empty()).then(|| format!("{name}: trees differ:\n    {}", d.join("\n    ")))
        }
        (false, false) => None,
        (true, false) => Some(format!(
            "{name}: Hydra rejects, verlc accepts. Hydra: {}",
            hydra.error.clone().unwrap_or_default()
        )),
        (false, true) => Some(format!(
            "{name}: verlc rejects, Hydra accepts. verlc: {}",
            verlc.error.clone().unwrap_or_default()
        )),
    }
}

// ---------------------------------------------------------------- the cases

fn example_cases(verl: &Path) -> Vec<Case> {
    let mut cases = fixture_cases("verl_examples", "", verl, true);
    // verl 0.7.0's SFT calls: the legacy `fsdp_sft_trainer`'s (config `sft_trainer`) and the
    // engine trainer's.
    cases.extend(fixture_cases(
        "verl_sft_examples_0_7_0",
        "verl 0.7.0 SFT: ",
        verl,
        true,
    ));
    cases
}

/// The command lines of a fixture's `overrides.json`, composed on `tree`; names get `prefix`.
/// `builtin`: also compose them on verlc's built-in tree (verl 0.7.0's).
fn fixture_cases(fixture: &str, prefix: &str, tree: &Path, builtin: bool) -> Vec<Case> {
    let path = workspace()
        .join("tests/fixtures")
        .join(fixture)
        .join("overrides.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let list: Vec<Value> = serde_json::from_str(&text).expect("overrides.json is JSON");
    list.iter()
        .map(|e| {
            assert!(
                e["config_dir"].is_null(),
                "CI fixture cases compose verl's own config dir"
            );
            let mut name = format!("{prefix}{}", e["script"].as_str().unwrap_or("?"));
            if let Some(n) = e["call"].as_u64() {
                name = format!("{name}#{n}");
            }
            Case {
                name,
                config_dir: tree.to_path_buf(),
                config_name: e["config_name"]
                    .as_str()
                    .unwrap_or("ppo_trainer")
                    .to_string(),
                overrides: e["overrides"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|o| o.as_str().map(str::to_string))
                    .collect(),
                cwd: None,
                builtin,
            }
        })
        .collect()
}

/// verl 0.7.0's example calls as `verlc migrate --to 0.9.1` prints them (its JSON output: the
/// same arguments as the shell-quoted lines, hostile.rs checks the quoting), composed on verl
/// 0.9.1's tree: what a user pastes after moving to 0.9.1.
fn migrated_cases() -> Vec<Case> {
    let Some(tree) = support::release_tree("0.9.1") else {
        return Vec::new();
    };
    fixture_cases("verl_examples", "migrated to 0.9.1: ", &tree, false)
        .into_iter()
        .map(|mut c| {
            let out = Command::new(env!("CARGO_BIN_EXE_verlc"))
                .args(["migrate", "--format", "json", "--"])
                .args(&c.overrides)
                .output()
                .expect("run verlc migrate");
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "{}: verlc migrate printed no JSON ({e}): {}",
                    c.name,
                    String::from_utf8_lossy(&out.stderr)
                )
            });
            c.overrides = v["overrides"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| o.as_str().map(str::to_string))
                .collect();
            c
        })
        .collect()
}

/// verl 0.7.1's and 0.8.0's example calls on their own trees and 0.9.0's on verl 0.9.1's
/// (unpacked by scripts/setup; none without).
fn release_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (fixture, release, prefix) in [
        ("verl_examples_0_7_1", "0.7.1", "verl 0.7.1: "),
        ("verl_examples_0_8_0", "0.8.0", "verl 0.8: "),
        ("verl_examples_0_9_0", "0.9.0", "verl 0.9.0: "),
        ("verl_examples_0_9_0", "0.9.1", "verl 0.9: "),
        // verl's SFT trainer's calls (`sft_trainer_engine`).
        ("verl_sft_examples_0_9_0", "0.9.0", "verl 0.9.0 SFT: "),
        ("verl_sft_examples_0_9_0", "0.9.1", "verl 0.9 SFT: "),
    ] {
        let Some(tree) = support::release_tree(release) else {
            continue;
        };
        out.extend(fixture_cases(fixture, prefix, &tree, false));
    }
    out
}

fn default_cases(verl: &Path) -> Vec<Case> {
    let mut v = vec![
        // verlc's built-in 0.7.0 tree carries the SFT trainer's config too.
        Case::new(
            "defaults: sft_trainer_engine",
            verl,
            "sft_trainer_engine",
            &[],
        ),
        Case::new(
            "defaults: sft_trainer_engine on megatron",
            verl,
            "sft_trainer_engine",
            &[
                "engine=megatron",
                "optim=megatron",
                "data.train_batch_size=64",
            ],
        ),
        Case::new("defaults: ppo_trainer", verl, "ppo_trainer", &[]),
        Case::new(
            "defaults: ppo_megatron_trainer",
            verl,
            "ppo_megatron_trainer",
            &[],
        ),
        Case::new(
            "defaults: ppo_trainer, rollout vllm",
            verl,
            "ppo_trainer",
            &["actor_rollout_ref.rollout.name=vllm"],
        ),
        Case::new(
            "defaults: ppo_megatron_trainer, rollout vllm",
            verl,
            "ppo_megatron_trainer",
            &["actor_rollout_ref.rollout.name=vllm"],
        ),
        Case::new(
            "defaults: config name with .yaml",
            verl,
            "ppo_megatron_trainer.yaml",
            &[],
        ),
    ];
    v.iter_mut().for_each(|c| c.builtin = true);
    // 0.7.0's legacy SFT config: verl's tree only (verlc names it, and does not carry it).
    v.push(Case::new(
        "defaults: sft_trainer (0.7.0's legacy SFT config)",
        verl,
        "sft_trainer",
        &[],
    ));
    v
}

/// Hand-written cases on verl's tree: the override grammar and struct mode.
fn override_edge_cases(verl: &Path) -> Vec<Case> {
    let f = |name: &str, o: &[&str]| Case::new(format!("edge: {name}"), verl, "ppo_trainer", o);
    let m = |name: &str, o: &[&str]| {
        Case::new(
            format!("edge (megatron): {name}"),
            verl,
            "ppo_megatron_trainer",
            o,
        )
    };
    vec![
        f(
            "+key new",
            &[
                "+trainer.my_new_key=1",
                "+actor_rollout_ref.model.override_config.attention_dropout=0.1",
            ],
        ),
        f("+key new nested path", &["+trainer.brand.new.path=x"]),
        f("+key existing", &["+trainer.nnodes=2"]),
        f(
            "++key existing and new",
            &["++trainer.nnodes=2", "++trainer.another_new=[1,2]"],
        ),
        f("~key existing", &["~trainer.nnodes"]),
        f("~key absent", &["~trainer.no_such_key"]),
        f("~key with matching value", &["~trainer.nnodes=1"]),
        f("~key with other value", &["~trainer.nnodes=5"]),
        f(
            "~key of a subtree",
            &["~actor_rollout_ref.actor.checkpoint"],
        ),
        f(
            "dict value merges",
            &["actor_rollout_ref.actor.optim={lr: 2e-6, weight_decay: 0.1}"],
        ),
        f(
            "dict value with unknown key",
            &["actor_rollout_ref.actor.optim={lr: 2e-6, nope: 1}"],
        ),
        f(
            "dict value into empty dict",
            &["actor_rollout_ref.model.override_config={attention_dropout: 0.1}"],
        ),
        f(
            "+dict value",
            &["+trainer.extra={a: 1, b: [x, y], c: {d: null}}"],
        ),
        f(
            "list values",
            &[
                "trainer.logger=[console,wandb]",
                "data.train_files=['a.parquet', \"b.parquet\"]",
                "trainer.device=cuda",
            ],
        ),
        f(
            "empty list and dict",
            &["trainer.logger=[]", "+trainer.empty={}"],
        ),
        f(
            "list replaces scalar",
            &["data.train_files=[x]", "data.val_files=y"],
        ),
        f(
            "quoted strings with commas",
            &[
                "trainer.experiment_name='a,b'",
                "trainer.project_name=\"x y, z\"",
            ],
        ),
        f(
            "unquoted commas are a sweep",
            &["trainer.experiment_name=a,b"],
        ),
        f(
            "typed primitives",
            &[
                "trainer.nnodes=null",
                "trainer.total_epochs=1_000",
                "actor_rollout_ref.actor.optim.lr=1e-6",
                "trainer.val_before_train=TRUE",
                "trainer.project_name=",
                "trainer.experiment_name=010",
            ],
        ),
        f(
            "casts",
            &[
                "trainer.total_epochs=int(3.7)",
                "trainer.project_name=str(12)",
                "actor_rollout_ref.actor.optim.lr=float(1)",
            ],
        ),
        f("inf and nan", &["+trainer.big=inf", "+trainer.small=-inf"]),
        f(
            "escapes and specials",
            &[
                "trainer.experiment_name=a\\,b",
                "trainer.project_name=~/runs/$USER",
                "data.train_files=$HOME/data/x.parquet",
            ],
        ),
        f("typo in a key", &["trainer.nnode=1"]),
        f("typo in a group", &["actor_rollout_ref.actr.optim.lr=1e-6"]),
        f("key below a scalar", &["trainer.nnodes.x=1"]),
        f("bad grammar", &["trainer.nnodes=<x>"]),
        f("unbalanced brace", &["trainer.experiment_name=run}"]),
        f(
            "group override",
            &["actor@actor_rollout_ref.actor=megatron_actor"],
        ),
        f(
            "group override to missing option",
            &["actor@actor_rollout_ref.actor=no_such_actor"],
        ),
        f(
            "group override with wrong package",
            &["actor=megatron_actor"],
        ),
        f("group override to null", &["critic@critic=null"]),
        f("+group new", &["+optim@trainer.extra_optim=fsdp"]),
        f(
            "group and value overrides",
            &[
                "critic@critic=megatron_critic",
                "critic.megatron.tensor_model_parallel_size=2",
            ],
        ),
        f(
            "interpolation to an existing key",
            &[
                "trainer.project_name=${trainer.experiment_name}",
                "+trainer.dir=ckpt/${trainer.nnodes}/${.project_name}",
            ],
        ),
        f(
            "interpolation to a missing key",
            &["+trainer.bad=${trainer.no_such_key}"],
        ),
        f(
            "oc.select fallback",
            &["+trainer.sel=${oc.select:trainer.no_such_key,5}"],
        ),
        f(
            "interpolation to ???",
            &["+trainer.name_copy=${actor_rollout_ref.rollout.name}"],
        ),
        f(
            "??? set to ??? again",
            &["actor_rollout_ref.rollout.name=???"],
        ),
        f(
            "interpolation cycle",
            &["+trainer.a=${trainer.b}", "+trainer.b=${trainer.a}"],
        ),
        f("hydra key", &["hydra.job.name=x"]),
        f(
            "+key on a null value",
            &[
                "+trainer.resume_from_path=/ckpt",
                "+actor_rollout_ref.actor.optim.total_training_steps=5",
            ],
        ),
        f(
            "+dict merges into an existing dict",
            &["+actor_rollout_ref.actor.optim={nope: 1, lr: 3e-6}"],
        ),
        f(
            "++dict merges without struct mode",
            &["++actor_rollout_ref.actor.checkpoint={brand: {new: 1}}"],
        ),
        f(
            "dict with a new nested key",
            &["actor_rollout_ref.actor.optim={nope: {x: 1}}"],
        ),
        f(
            "dict into list, nested",
            &["actor_rollout_ref.actor.checkpoint={save_contents: {a: 1}}"],
        ),
        f(
            "scalar replaces list, nested",
            &["actor_rollout_ref.actor.checkpoint={save_contents: x}"],
        ),
        f(
            "??? in a dict value keeps the old value",
            &["actor_rollout_ref.actor.optim={lr: ???, weight_decay: 0.5}"],
        ),
        f(
            "dict replaces scalar and scalar replaces dict",
            &[
                "trainer.project_name={a: 1}",
                "actor_rollout_ref.actor.optim=null",
            ],
        ),
        f("dict into list", &["trainer.logger={a: 1}"]),
        f("list into dict", &["actor_rollout_ref.actor.optim=[1]"]),
        f("list index set", &["trainer.logger.0=wandb"]),
        f("list index out of range", &["trainer.logger.5=wandb"]),
        f("~key on null value", &["~trainer.resume_from_path"]),
        f(
            "~key on an interpolation resolving to null",
            &["~actor_rollout_ref.rollout.profiler.tool"],
        ),
        f("~key on ???", &["~actor_rollout_ref.rollout.name"]),
        f(
            "~key with equal value of another type",
            &["~trainer.nnodes=1.0"],
        ),
        f(
            "~key of a list with its value",
            &["~trainer.logger=[console,wandb]"],
        ),
        f("~group", &["~critic"]),
        f(
            "~group with option",
            &["~algorithm@algorithm.rollout_correction=rollout_correction"],
        ),
        f(
            "~group with the wrong option",
            &["~algorithm@algorithm.rollout_correction=nope"],
        ),
        f("group override to a list", &["critic=[dp_critic]"]),
        f(
            "group override with a package that is no group",
            &["trainer@trainer=x"],
        ),
        f(
            "hydra.searchpath on the command line",
            &["hydra.searchpath=[file:///nonexistent]"],
        ),
        f("unknown hydra key", &["hydra.nope=x"]),
        f("+unknown hydra key", &["+hydra.nope=x"]),
        f(
            "ints, floats and strings by the lexer",
            &[
                "trainer.nnodes=1e5",
                "trainer.total_epochs=01.5",
                "+trainer.f1=.5",
                "+trainer.f2=5.",
                "+trainer.i1=+5",
                "+trainer.s1=1__0",
                "+trainer.s2=Infinity",
                "+trainer.s3=10.0.0.1",
            ],
        ),
        f(
            "whitespace and colons",
            &[
                "trainer.project_name=a : b",
                "trainer.experiment_name=  x",
                "trainer.logger=[a , b ]",
                "+trainer.colon=a:b",
            ],
        ),
        f(
            "quotes and escapes",
            &[
                "trainer.project_name='a\\'b'",
                "trainer.experiment_name=\"\"",
                "+trainer.esc=a\\ b\\,c\\x",
            ],
        ),
        f(
            "quoted interpolation",
            &["trainer.project_name='${trainer.experiment_name}'"],
        ),
        f(
            "concatenated interpolations",
            &["trainer.project_name=${trainer.experiment_name}${trainer.nnodes}"],
        ),
        f(
            "self interpolation",
            &["trainer.nnodes='${trainer.nnodes}'"],
        ),
        f(
            "nested interpolation needs quotes",
            &["trainer.project_name=${oc.select:a,${trainer.nnodes}}"],
        ),
        f(
            "nested interpolation quoted",
            &["trainer.project_name='${oc.select:a,${trainer.nnodes}}'"],
        ),
        f(
            "function casts and sort",
            &[
                "trainer.nnodes=int(-3.7)",
                "+trainer.l=str([1, true, 2.0])",
                "+trainer.b=bool(null)",
                "+trainer.s=sort([3,1,2])",
                "+trainer.fv=float(' 1_0 ')",
                "+trainer.kv=int(value=3)",
            ],
        ),
        f("bad casts", &["trainer.nnodes=int(null)"]),
        f("unknown function", &["trainer.nnodes=nope(1)"]),
        f(
            "characters Hydra does not lex",
            &["trainer.project_name=a#b"],
        ),
        f("non-ascii unquoted", &["trainer.project_name=h\u{e9}llo"]),
        f("non-ascii quoted", &["trainer.project_name='h\u{e9}llo'"]),
        f(
            "dict keys",
            &["+trainer.x={1: a, b-c: 2}", "+trainer.y={a: 1, a: 2}"],
        ),
        f("quoted dict key", &["+trainer.x={'a': 1}"]),
        f(
            "keys with $ and -",
            &[
                "+trainer.a-b=1",
                "+trainer.$x=1",
                "+trainer.0=1",
                "+trainer.x.0=1",
                "+trainer/x=1",
            ],
        ),
        f("space before =", &["trainer.nnodes =1"]),
        f("=value with =", &["trainer.project_name=a=b"]),
        m(
            "megatron: engine knobs",
            &[
                "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend='fused'",
                "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform",
                "actor_rollout_ref.actor.megatron.param_offload=True",
            ],
        ),
        m(
            "megatron: group back to fsdp actor",
            &["actor@actor_rollout_ref.actor=dp_actor"],
        ),
    ]
}

/// Scratch files of this test, under cargo's per-target temp dir (reused across runs).
fn scratch() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hydra-parity");
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// `<root>/verl/trainer/config` -> verl's installed tree, the layout `file://verl/trainer/config`
/// search paths expect relative to the working directory.
fn link_verl_tree(root: &Path, verl: &Path) {
    let link = root.join("verl/trainer/config");
    if std::fs::read_link(&link).is_ok_and(|t| t == verl) {
        return;
    }
    std::fs::create_dir_all(root.join("verl/trainer")).expect("mkdir");
    let tmp = root.join(format!("verl/trainer/config.tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(verl, &tmp).expect("symlink verl's tree");
    std::fs::rename(&tmp, &link).expect("place the symlink");
}

/// Primary configs in a user dir that extend verl's tree through `hydra.searchpath`.
fn searchpath_cases(verl: &Path) -> Vec<Case> {
    let root = scratch().join("searchpath");
    let user = root.join("user_conf");
    let abs = format!("file://{}", verl.display());
    write(
        &user.join("my_exp.yaml"),
        &format!(
            "hydra:\n  searchpath:\n    - {abs}\n\ndefaults:\n  - ppo_trainer\n  - _self_\n\ntrainer:\n  project_name: my_proj\n  total_epochs: 3\n  brand_new_key: 1\nactor_rollout_ref:\n  rollout:\n    name: vllm\n    n: 4\n"
        ),
    );
    // The spelling verl's own example dirs use, resolved against the working directory.
    write(
        &user.join("relative.yaml"),
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\n\ndefaults:\n  - ppo_megatron_trainer\n  - _self_\n\nactor_rollout_ref:\n  rollout:\n    name: sglang\n",
    );
    link_verl_tree(&root, verl);
    // `override` of a nested defaults entry, and an option of the user's own.
    write(
        &user.join("with_override.yaml"),
        &format!(
            "hydra:\n  searchpath:\n    - {abs}\n\ndefaults:\n  - ppo_trainer\n  - override critic@critic: megatron_critic\n  - override actor@actor_rollout_ref.actor: my_actor\n  - _self_\n\nalgorithm:\n  gamma: 0.99\n"
        ),
    );
    write(
        &user.join("actor/my_actor.yaml"),
        "defaults:\n  - dp_actor\n  - _self_\n\nppo_epochs: 2\nmy_actor_knob: true\n",
    );
    // `_self_` first: the defaults win over the primary's own values.
    write(
        &user.join("self_first.yaml"),
        &format!(
            "hydra:\n  searchpath:\n    - {abs}\n\ndefaults:\n  - _self_\n  - ppo_trainer\n\ntrainer:\n  nnodes: 7\n  only_here: x\n"
        ),
    );
    let mut rel = Case::new(
        "searchpath: relative file:// from cwd",
        &user,
        "relative",
        &["trainer.nnodes=2"],
    );
    rel.cwd = Some(root.clone());
    rel.builtin = true;
    vec![
        Case::new(
            "searchpath: extends ppo_trainer",
            &user,
            "my_exp",
            &["trainer.total_epochs=5", "trainer.brand_new_key=2"],
        ),
        Case::new(
            "searchpath: typo against extended tree",
            &user,
            "my_exp",
            &["trainer.total_epoch=5"],
        ),
        Case::new(
            "searchpath: group override to user option",
            &user,
            "my_exp",
            &["actor@actor_rollout_ref.actor=my_actor"],
        ),
        Case::new("searchpath: override entries", &user, "with_override", &[]),
        Case::new("searchpath: _self_ first", &user, "self_first", &[]),
        rel,
    ]
}

/// A small config tree of our own (tests/fixtures/hydra_composition) for the defaults-list
/// features verl's tree does not use: `# @package` headers against explicit packages,
/// `_here_`, `_global_`, absolute and `../` paths, `optional`, `_self_` first or in the
/// middle, interpolated, list and `???` options, duplicate entries, nested override keys.
fn composition_cases() -> Vec<Case> {
    let base = workspace().join("tests/fixtures/hydra_composition");
    let text = std::fs::read_to_string(base.join("cases.json"))
        .expect("read hydra_composition/cases.json");
    let list: Vec<Value> = serde_json::from_str(&text).expect("cases.json is JSON");
    list.iter()
        .map(|e| {
            let name = e["config_name"].as_str().unwrap_or("main");
            let mut c = Case::new("", &base.join("tree"), name, &[]);
            c.overrides = e["overrides"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| o.as_str().map(str::to_string))
                .collect();
            c.name = format!("composition: {name} {:?}", c.overrides);
            c
        })
        .collect()
}

/// verl 0.7.0's example config dirs (they extend verl's tree through `hydra.searchpath`), from
/// the fixture that carries them (tests/fixtures/verl_trees/0.7.0-examples), with the command
/// lines of the scripts that use them (tests/fixtures/verl_examples/skipped.json).
fn example_dir_cases(verl: &Path) -> Vec<Case> {
    let path = workspace().join("tests/fixtures/verl_examples/skipped.json");
    let text = std::fs::read_to_string(&path).expect("read skipped.json");
    let list: Vec<Value> = serde_json::from_str(&text).expect("skipped.json is JSON");
    // The example dirs next to a link to verl's tree, as `file://verl/trainer/config`
    // expects relative to the working directory (a repository checkout's root).
    let root = scratch().join("example-dirs");
    link_verl_tree(&root, verl);
    let fixture = verl_0_7_0_examples_root();
    let mut out = Vec::new();
    for e in &list {
        let Some(dir) = e["config_dir"].as_str() else {
            continue;
        };
        let link = root.join(dir);
        if !link.exists() {
            std::fs::create_dir_all(link.parent().expect("a parent")).expect("mkdir");
            let tmp = link.with_extension(format!("tmp{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(fixture.join(dir), &tmp).expect("symlink the example dir");
            let _ = std::fs::rename(&tmp, &link);
        }
        let mut c = Case::new(
            format!("example dir: {}", e["script"].as_str().unwrap_or("?")),
            &link,
            e["config_name"].as_str().unwrap_or("ppo_trainer"),
            &[],
        );
        c.overrides = e["overrides"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o.as_str().map(str::to_string))
            .collect();
        c.cwd = Some(root.clone());
        c.builtin = true;
        out.push(c);
    }
    assert!(
        out.len() >= 14,
        "the example-dir calls of verl 0.7.0 are loaded"
    );
    out
}

/// verl main's example command lines (tests/fixtures/verl_examples_main) composed on verl
/// main's own config tree at the ref the fixture was captured from
/// (tests/fixtures/verl_trees/main).
fn main_cases() -> Vec<Case> {
    fixture_cases(
        "verl_examples_main",
        "verl main: ",
        &verl_main_tree(),
        false,
    )
}

/// More cases from a JSON file (`VERLC_PARITY_EXTRA`), for exploring beyond the fixed set:
/// `[{"name": .., "config_name": .., "overrides": [..]}]`, composed on verl's tree.
fn extra_cases(verl: &Path) -> Vec<Case> {
    let Some(path) = std::env::var_os("VERLC_PARITY_EXTRA") else {
        return Vec::new();
    };
    let text = std::fs::read_to_string(&path).expect("read VERLC_PARITY_EXTRA");
    let list: Vec<Value> = serde_json::from_str(&text).expect("VERLC_PARITY_EXTRA is a JSON list");
    list.iter()
        .map(|e| {
            let mut c = Case::new(
                format!("extra: {}", e["name"].as_str().unwrap_or("?")),
                verl,
                e["config_name"].as_str().unwrap_or("ppo_trainer"),
                &[],
            );
            c.overrides = e["overrides"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| o.as_str().map(str::to_string))
                .collect();
            c
        })
        .collect()
}

struct World {
    cases: Vec<Case>,
    hydra: Vec<Outcome>,
    /// verlc on the same config dir.
    verlc: Vec<Outcome>,
    /// verlc on its built-in tree, for the cases marked `builtin`.
    builtin: Vec<Option<Outcome>>,
}

/// All cases with Hydra's and verlc's answers, computed once for both tests; verlc runs
/// while the Python processes work.
/// Hydra's outcome for a case whose remembered answer matches verlc's outcome: the same
/// verdict and, when accepted, the same tree (by digest), which is then verlc's tree.
fn remembered(a: &memo::Answer, verlc: &Outcome) -> Option<Outcome> {
    if a.ok != verlc.ok {
        return None;
    }
    if a.ok && a.digest != verlc.config.as_ref().map(memo::tree_digest) {
        return None;
    }
    Some(Outcome {
        ok: a.ok,
        error: a.error.clone(),
        config: if a.ok { verlc.config.clone() } else { None },
    })
}

/// What is remembered of Hydra's outcome: its error without this checkout's path (as the
/// keys write it).
fn answer_of(h: &Outcome, keys: &memo::Keys) -> memo::Answer {
    memo::Answer {
        ok: h.ok,
        error: h.error.as_ref().map(|e| keys.portable(e)),
        digest: h.config.as_ref().filter(|_| h.ok).map(memo::tree_digest),
    }
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let verl = verl_config_dir();
        let mut cases = example_cases(&verl);
        cases.extend(default_cases(&verl));
        cases.extend(override_edge_cases(&verl));
        cases.extend(searchpath_cases(&verl));
        cases.extend(composition_cases());
        cases.extend(example_dir_cases(&verl));
        cases.extend(main_cases());
        cases.extend(extra_cases(&verl));
        cases.extend(release_cases());
        cases.extend(migrated_cases());
        let verlc: Vec<Outcome> = cases.iter().map(verlc_on_dir).collect();
        // Hydra's remembered answers settle the cases whose inputs and verlc outcome are
        // unchanged (see `memo`); Hydra composes the rest, beside verlc's built-in runs.
        let site = verl.ancestors().nth(3).map(Path::to_path_buf);
        let mut keys = memo::Keys::new(&workspace(), site.as_deref(), &verl);
        let case_keys: Vec<String> = cases
            .iter()
            .map(|c| {
                keys.key(
                    &c.config_dir,
                    &c.config_name,
                    &c.overrides,
                    c.cwd.as_deref(),
                )
            })
            .collect();
        let store_path = memo::store_path(&workspace());
        let record = std::env::var_os("VERLC_HYDRA_RECORD").is_some();
        let store = if record {
            Default::default()
        } else {
            memo::load(&store_path)
        };
        let mut hydra: Vec<Option<Outcome>> = case_keys
            .iter()
            .zip(&verlc)
            .map(|(k, v)| remembered(store.get(k)?, v))
            .collect();
        let live: Vec<Case> = cases
            .iter()
            .zip(&hydra)
            .filter(|(_, h)| h.is_none())
            .map(|(c, _)| c.clone())
            .collect();
        let run = start_hydra(&live);
        let builtin = cases
            .iter()
            .map(|c| c.builtin.then(|| verlc_on_builtin(c, &verl)))
            .collect();
        let mut composed = finish_hydra(run).into_iter();
        for h in hydra.iter_mut().filter(|h| h.is_none()) {
            *h = composed.next();
        }
        let hydra: Vec<Outcome> = hydra
            .into_iter()
            .map(|h| h.expect("every case has Hydra's answer"))
            .collect();
        eprintln!(
            "Hydra composed {} of {} cases; the others were settled by its remembered answers ({})",
            live.len(),
            cases.len(),
            store_path.display()
        );
        if record {
            let answers = case_keys
                .iter()
                .zip(&hydra)
                .map(|(k, h)| (k.clone(), answer_of(h, &keys)))
                .collect();
            memo::save(&store_path, &answers);
        } else if !live.is_empty() {
            eprintln!(
                "  (VERLC_HYDRA_RECORD=1 cargo test -p verlc --test hydra_parity remembers them)"
            );
        }
        World {
            cases,
            hydra,
            verlc,
            builtin,
        }
    })
}

#[test]
fn verl_tree_composes_like_hydra() {
    let w = world();
    let mut failures = Vec::new();
    let (mut accepted, mut rejected) = (0, 0);
    for ((case, hydra), verlc) in w.cases.iter().zip(&w.hydra).zip(&w.verlc) {
        if hydra.ok {
            accepted += 1
        } else {
            rejected += 1
        }
        if let Some(f) = compare(&case.name, verlc, hydra) {
            failures.push(f);
        }
    }
    eprintln!(
        "{} cases: Hydra accepts {accepted}, rejects {rejected}; {} disagreements",
        w.cases.len(),
        failures.len()
    );
    // verl main's examples: most compose (a tree that failed to load would make Hydra and
    // verlc agree on rejecting every one).
    let main: Vec<bool> = w
        .cases
        .iter()
        .zip(&w.hydra)
        .filter(|(c, _)| c.name.starts_with("verl main: "))
        .map(|(_, h)| h.ok)
        .collect();
    let ok = main.iter().filter(|o| **o).count();
    eprintln!(
        "verl main ({VERL_MAIN_REF}): Hydra accepts {ok} of {} example command lines",
        main.len()
    );
    // verl 0.7.0's calls that compose on 0.7.0's tree compose on 0.9.1's as `verlc migrate`
    // rewrites them.
    let on_0_7: std::collections::HashMap<&str, bool> = w
        .cases
        .iter()
        .zip(&w.hydra)
        .filter(|(c, _)| !c.name.contains(": "))
        .map(|(c, h)| (c.name.as_str(), h.ok))
        .collect();
    let migrated_of = |c: &Case| -> bool {
        c.name
            .strip_prefix("migrated to 0.9.1: ")
            .is_some_and(|orig| on_0_7.get(orig).copied() == Some(true))
    };
    let migrated: Vec<&String> = w
        .cases
        .iter()
        .zip(&w.hydra)
        .filter(|(c, h)| migrated_of(c) && !h.ok)
        .map(|(c, _)| &c.name)
        .collect();
    let total = w.cases.iter().filter(|c| migrated_of(c)).count();
    if total > 0 {
        eprintln!(
            "verl 0.7.0's calls migrated to 0.9.1: Hydra composes {} of {total}; not: {migrated:#?}",
            total - migrated.len()
        );
        assert!(
            (total - migrated.len()) * 100 >= total * 98,
            "migrated calls that do not compose on 0.9.1: {migrated:#?}"
        );
    }
    assert!(
        !main.is_empty() && ok * 4 >= main.len() * 3,
        "verl main's tree did not compose"
    );
    assert!(
        failures.is_empty(),
        "verlc and Hydra disagree on {} of {} cases:\n{}",
        failures.len(),
        w.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn builtin_tree_composes_like_verls() {
    let w = world();
    let mut failures = Vec::new();
    let mut n = 0;
    for ((case, hydra), builtin) in w.cases.iter().zip(&w.hydra).zip(&w.builtin) {
        let Some(verlc) = builtin else { continue };
        n += 1;
        if let Some(f) = compare(&format!("builtin: {}", case.name), verlc, hydra) {
            failures.push(f);
        }
    }
    assert!(n > 100, "the example fixture is loaded");
    assert!(
        failures.is_empty(),
        "verlc's built-in tree differs from verl's on {} of {n} cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
