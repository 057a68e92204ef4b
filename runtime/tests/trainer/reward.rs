//! Reward functions: the built-in rule scorers, and the user's Python `compute_score` in a
//! subprocess: same scores as calling it directly, clear errors for crashing, raising,
//! hanging and unimportable functions.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use verlc_runtime::workers::reward::rules::{
    default_compute_score, gsm8k, math_boxed, strip_string,
};
use verlc_runtime::workers::reward::{
    PythonRewardFn, PythonSettings, RewardError, RewardFn, ScoreItem,
};

use crate::support::{quiet, repo, scratch, small_grpo, small_grpo_on};

fn fixture(name: &str) -> PathBuf {
    repo().join("runtime/tests/trainer/fixtures").join(name)
}

fn settings(file: &str, timeout: Duration) -> PythonSettings {
    let mut kwargs = Map::new();
    kwargs.insert("bonus".into(), json!(0.125));
    PythonSettings {
        python: PythonSettings::default_python(),
        path: fixture(file),
        name: "compute_score".into(),
        reward_kwargs: if file == "reward_fn.py" {
            kwargs
        } else {
            Map::new()
        },
        startup_timeout: Duration::from_secs(60),
        call_timeout: timeout,
    }
}

fn item(source: &str, text: &str, truth: Value, index: i64) -> ScoreItem {
    let mut extra = Map::new();
    extra.insert("index".into(), json!(index));
    extra.insert("split".into(), json!("train"));
    ScoreItem {
        data_source: source.into(),
        solution_str: text.into(),
        ground_truth: truth,
        extra_info: extra,
    }
}

/// The scores a Python `script` prints as a JSON list (its last line) when called directly
/// with `args`: what it scores may print too (verl's Search-R1 scorer prints a sample's
/// details to stdout one call in 64, at random).
fn direct_scores(script: &str, args: &[String]) -> Vec<f64> {
    let out = Command::new(PythonSettings::default_python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("scores json ({e}): {stdout}"))
}

fn items() -> Vec<ScoreItem> {
    let texts = [
        "31204",
        "3 1 2",
        "no digits",
        "✓ 42 ünïcode",
        "",
        "31204\n",
        "9999999",
        "0",
    ];
    let mut out = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        let source = if i % 2 == 0 {
            "builtin/digit_reversal"
        } else {
            "custom/int"
        };
        out.push(item(source, t, json!("31204"), i as i64));
    }
    out
}

#[test]
fn python_reward_gives_the_scores_of_a_direct_call() {
    let items = items();
    let mut f = PythonRewardFn::start(settings("reward_fn.py", Duration::from_secs(60)))
        .expect("server starts");
    let got = f.score(&items).expect("scores");
    // Twice through the same process: the server is long-lived.
    let again = f.score(&items).expect("scores again");
    assert_eq!(got, again);

    // The same calls made directly in Python.
    let dir = scratch("reward_direct");
    let input = dir.join("items.json");
    let payload: Vec<Value> = items
        .iter()
        .map(|it| json!({"data_source": it.data_source, "solution_str": it.solution_str, "ground_truth": it.ground_truth, "extra_info": it.extra_info}))
        .collect();
    std::fs::write(&input, serde_json::to_string(&payload).expect("json")).expect("write");
    let script = r#"
import json, sys, importlib.util
spec = importlib.util.spec_from_file_location("m", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
out = []
for it in json.load(open(sys.argv[2])):
    r = m.compute_score(it["data_source"], it["solution_str"], it["ground_truth"], it["extra_info"], bonus=0.125)
    out.append(float(r["score"]) if isinstance(r, dict) else float(r))
print(json.dumps(out))
"#;
    let direct = direct_scores(
        script,
        &[
            fixture("reward_fn.py").display().to_string(),
            input.display().to_string(),
        ],
    );
    let through: Vec<f64> = got.iter().map(|s| s.score).collect();
    assert_eq!(through, direct, "subprocess and direct call differ");
    // Dict results keep their other keys (verl's reward_extra_info).
    assert_eq!(got[0].extra.get("acc"), Some(&json!(1.0)));
    assert_eq!(got[0].extra.get("note"), Some(&json!("third")));
    assert!(got[1].extra.is_empty());
}

#[test]
fn crashing_and_raising_reward_functions_give_clear_errors() {
    let mut f = PythonRewardFn::start(settings("reward_crash.py", Duration::from_secs(60)))
        .expect("server starts");
    assert_eq!(
        f.score(&[item("x", "fine", json!("1"), 1)]).expect("ok")[0].score,
        0.0
    );
    // The error names the response it was raised on (the second here).
    let err = f
        .score(&[
            item("x", "fine", json!("1"), 1),
            item("x", "please raise", json!("1"), 1),
        ])
        .expect_err("raises");
    assert!(
        matches!(err, RewardError::Sample { index: 1, .. }),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.contains("ZeroDivisionError") && err.contains("raised an exception"),
        "{err}"
    );
    // The server survives an exception in user code.
    assert_eq!(
        f.score(&[item("x", "fine", json!("1"), 2)])
            .expect("still serving")[0]
            .score,
        0.0
    );
    let err = f
        .score(&[item("x", "boom", json!("1"), 1)])
        .expect_err("process dies")
        .to_string();
    assert!(err.contains("exited") && err.contains("7"), "{err}");
    let err = f
        .score(&[item("x", "fine", json!("1"), 1)])
        .expect_err("dead")
        .to_string();
    assert!(err.contains("no longer running"), "{err}");

    let err = PythonRewardFn::start(settings("reward_syntax.py", Duration::from_secs(60)))
        .expect_err("syntax error")
        .to_string();
    assert!(
        err.contains("SyntaxError") && err.contains("failed to load"),
        "{err}"
    );
    let mut s = settings("reward_fn.py", Duration::from_secs(60));
    s.name = "no_such_function".into();
    let err = PythonRewardFn::start(s)
        .expect_err("missing function")
        .to_string();
    assert!(err.contains("no_such_function"), "{err}");
    let mut s = settings("reward_fn.py", Duration::from_secs(60));
    s.path = fixture("missing.py");
    assert!(PythonRewardFn::start(s).is_err());
}

#[test]
fn hanging_reward_function_times_out() {
    let mut f = PythonRewardFn::start(settings("reward_hang.py", Duration::from_secs(2)))
        .expect("server starts");
    let t = Instant::now();
    let err = f
        .score(&[item("x", "anything", json!("1"), 1)])
        .expect_err("times out");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    assert!(matches!(err, RewardError::Timeout { .. }), "{err}");
    assert!(
        err.to_string().contains("did not answer within 2 s"),
        "{err}"
    );
}

/// The interpreter may be a wrapper whose Python is a grandchild (a shell script, `conda run`):
/// a reward function stuck in user code still ends with the timeout, and its Python with it.
#[test]
fn a_hanging_reward_function_behind_a_wrapper_interpreter_is_killed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("reward_hang_wrapper");
    let wrapper = dir.join("python-wrapper");
    // No `exec`: the shell stays the direct child, Python runs under it.
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\n{} \"$@\"\n", PythonSettings::default_python()),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
        .expect("make the wrapper executable");
    // A copy of its own, so that only this test's Python runs it.
    let hang = dir.join("reward_hang_behind_wrapper.py");
    std::fs::copy(fixture("reward_hang.py"), &hang).expect("copy the fixture");
    let mut s = settings("reward_hang.py", Duration::from_secs(2));
    s.python = wrapper.display().to_string();
    s.path = hang.clone();
    let mut f = PythonRewardFn::start(s).expect("server starts");
    let t = Instant::now();
    let err = f
        .score(&[item("x", "anything", json!("1"), 1)])
        .expect_err("times out");
    assert!(matches!(err, RewardError::Timeout { .. }), "{err}");
    drop(f);
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    // The Python under the wrapper is gone too.
    let hang = hang.display().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .any(|c| String::from_utf8_lossy(&c).contains(&hang));
        if !alive {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hung reward function's Python still runs"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn trainer_fails_cleanly_on_a_crashing_reward_function() {
    let dir = scratch("trainer_reward_crash");
    let path = format!(
        "custom_reward_function.path={}",
        fixture("reward_hang.py").display()
    );
    let cfg = small_grpo(&dir, 2, &[&path]);
    let opts = verlc_runtime::trainer::RunOptions {
        reward_call_timeout: Duration::from_secs(2),
        ..quiet()
    };
    let t = Instant::now();
    let err = verlc_runtime::trainer::run(&cfg, &opts)
        .expect_err("the reward function hangs")
        .to_string();
    assert!(err.contains("did not answer"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(120));
}

/// verl 0.7.0 with a reward model validates rule-scored data only: a validation set whose first
/// row is `style: model` (HH-RLHF's, a source no scorer covers) ends validation without
/// metrics, so the run is not refused up front for that source, while a training source no
/// scorer covers still is when no reward model scores it.
#[test]
fn model_scored_validation_data_needs_no_scorer_with_a_reward_model() {
    let dir = scratch("reward_model_scored_validation");
    let val = dir.join("hh.json");
    let rows: String = (0..4)
        .map(|i| {
            format!(
                "{}\n",
                json!({"data_source": "Dahoas/full-hh-rlhf",
                       "prompt": [{"role": "user", "content": format!("reverse {i}{i}3")}],
                       "reward_model": {"style": "model", "ground_truth": "ok"}})
            )
        })
        .collect();
    std::fs::write(&val, rows).expect("write validation rows");
    let val = format!("data.val_files={}", val.display());
    let tiny = "reward_model.model.path='builtin://tiny?layers=2&hidden=32&heads=2&kv_heads=2'";
    let with_rm = [
        val.as_str(),
        "reward_model.enable=true",
        tiny,
        "trainer.test_freq=1",
        "reward_model.use_reward_loop=false",
        "reward_model.micro_batch_size_per_gpu=8",
    ];
    let summary =
        verlc_runtime::trainer::run(&small_grpo(&dir, 1, &with_rm), &quiet()).expect("runs");
    // The reward model scored the training step; validation (at step 1) logged nothing.
    assert_eq!(summary.history.len(), 1);
    assert!(summary.history[0].1.contains_key("critic/score/mean"));
    assert!(
        summary
            .history
            .iter()
            .all(|(_, m)| m.keys().all(|k| !k.starts_with("val-"))),
        "no validation metrics"
    );
    // Without the reward model the reward function scores that data, and cannot.
    let err = verlc_runtime::trainer::run(
        &small_grpo(&dir, 1, &[val.as_str(), "trainer.test_freq=1"]),
        &quiet(),
    )
    .expect_err("no scorer for the validation source")
    .to_string();
    assert!(err.contains("Dahoas/full-hh-rlhf"), "{err}");
}

#[test]
fn trainer_scores_with_a_python_reward_function() {
    let dir = scratch("trainer_reward_python");
    let path = format!(
        "custom_reward_function.path={}",
        fixture("reward_fn.py").display()
    );
    let cfg = small_grpo(
        &dir,
        1,
        &[&path, "+custom_reward_function.reward_kwargs={bonus: 0.0}"],
    );
    let summary = verlc_runtime::trainer::run(&cfg, &quiet()).expect("runs");
    let score = summary.history[0].1["critic/score/mean"];
    assert!((0.0..=1.0).contains(&score), "{score}");
}

#[test]
fn gsm8k_scorer() {
    assert_eq!(gsm8k("so the answer is #### 72", "72"), 1.0);
    assert_eq!(gsm8k("#### 1,234", "1234"), 1.0);
    assert_eq!(
        gsm8k("#### $5", "5"),
        0.0,
        "`$` is not part of the strict pattern"
    );
    assert_eq!(
        gsm8k("#### 3 then #### 4", "4"),
        1.0,
        "the last answer counts"
    );
    assert_eq!(gsm8k("#### -7", "-7"), 1.0);
    assert_eq!(gsm8k("the answer is 72", "72"), 0.0, "strict format");
    assert_eq!(gsm8k("####72", "72"), 0.0);
    let long = format!("#### 72 {}", "x".repeat(400));
    assert_eq!(
        gsm8k(&long, "72"),
        0.0,
        "only the last 300 characters are searched"
    );
    assert_eq!(
        default_compute_score("openai/gsm8k", "#### 8", &json!("8")).expect("known"),
        1.0
    );
}

#[test]
fn boxed_math_scorer() {
    assert_eq!(math_boxed("thus \\boxed{\\frac{1}{2}}", "\\frac12"), 1.0);
    assert_eq!(math_boxed("\\boxed{0.5}", "\\frac{1}{2}"), 1.0);
    assert_eq!(math_boxed("\\boxed{\\dfrac{3}{4}}", "3/4"), 1.0);
    assert_eq!(math_boxed("\\boxed{10^\\circ}", "10"), 1.0);
    assert_eq!(math_boxed("\\boxed{x = 5}", "5"), 1.0);
    assert_eq!(math_boxed("\\boxed{\\sqrt2}", "\\sqrt{2}"), 1.0);
    assert_eq!(math_boxed("first \\boxed{1} then \\boxed{2}", "2"), 1.0);
    assert_eq!(math_boxed("\\boxed 7$", "7"), 1.0);
    assert_eq!(
        math_boxed("\\fbox{9}", "9"),
        0.0,
        "verl does not unbox \\fbox"
    );
    assert_eq!(math_boxed("\\boxed{3}", "4"), 0.0);
    assert_eq!(math_boxed("no box 4", "4"), 0.0);
    assert_eq!(math_boxed("\\boxed{5", "5"), 0.0, "unclosed");
    assert_eq!(
        strip_string("\\left( 1, 2 \\right)").as_deref(),
        Some("(1,2)")
    );
    assert_eq!(strip_string("5 \\text{ cm}").as_deref(), Some("5"));
    assert_eq!(
        default_compute_score("HuggingFaceH4/MATH-500", "\\boxed{4}", &json!("4")).expect("known"),
        1.0
    );
}

#[test]
fn unknown_data_source_is_reported_up_front() {
    let err = default_compute_score("my/dataset", "x", &json!("y"))
        .expect_err("unknown")
        .to_string();
    assert!(
        err.contains("my/dataset") && err.contains("custom_reward_function.path"),
        "{err}"
    );
    assert_eq!(
        default_compute_score("builtin/digit_reversal", "321", &json!("321")).expect("builtin"),
        1.0
    );
}

/// Sources only verl's `default_compute_score` covers (DAPO math, geometry3k, Search-R1) are
/// scored by verl's own function in one round trip, beside verlc's rules: the same scores as
/// calling verl directly; a source neither covers fails before any scoring.
#[test]
fn sources_only_verl_scores_go_to_verls_default_compute_score() {
    let settings = || settings("reward_fn.py", Duration::from_secs(60));
    let err = RewardFn::for_sources(["openai/gsm8k", "my/dataset"], settings)
        .expect_err("no scorer")
        .to_string();
    assert!(
        err.contains("my/dataset") && err.contains("math_dapo"),
        "{err}"
    );
    let items = vec![
        item("math_dapo", "so\nAnswer: 34", json!("34"), 0),
        item("openai/gsm8k", "#### 12", json!("12"), 1),
        item("math_dapo", "Answer: 35", json!("34"), 2),
        item(
            "hiyouga/geometry3k",
            "<think>x</think> \\boxed{7}",
            json!("7"),
            3,
        ),
        item(
            "searchR1_nq",
            "<answer>Paris</answer>",
            json!({"target": ["Paris"]}),
            4,
        ),
    ];
    let mut f = RewardFn::for_sources(items.iter().map(|i| i.data_source.as_str()), settings)
        .expect("verl's scorers load");
    let got = f.score(&items).expect("scores");
    // verl itself, called directly.
    let payload: Vec<Value> = items
        .iter()
        .map(|it| json!([it.data_source, it.solution_str, it.ground_truth]))
        .collect();
    // verl's scorers imported under package stubs: verl's package root imports Ray.
    let script = r#"
import importlib, importlib.util, json, os, sys, types
root = os.path.dirname(importlib.util.find_spec("verl").origin)
for name, path in [("verl", root), ("verl.utils", os.path.join(root, "utils"))]:
    sys.modules[name] = types.ModuleType(name)
    sys.modules[name].__path__ = [path]
scorers = importlib.import_module("verl.utils.reward_score")
default_compute_score = scorers.default_compute_score
out = []
for source, text, truth in json.loads(sys.argv[1]):
    r = default_compute_score(source, text, truth)
    out.append(float(r["score"]) if isinstance(r, dict) else float(r))
print(json.dumps(out))
"#;
    let direct = direct_scores(script, &[serde_json::to_string(&payload).expect("json")]);
    let through: Vec<f64> = got.iter().map(|s| s.score).collect();
    assert_eq!(through, direct);
    assert_eq!(through[0], 1.0, "a right DAPO answer");
    assert!(through[2] < 1.0, "a wrong DAPO answer");
    // verl's DAPO scorer returns a dict: its `acc` and `pred` are kept.
    assert_eq!(got[0].extra.get("pred"), Some(&json!("34")));
}

/// GDPO in the loop: the components come from the Python compute_score's dict (a float and a
/// bool), get their `gdpo/<key>/*` metrics, and the advantages are whitened (mean 0 over the
/// batch's tokens). A key the function does not return stops the run naming the keys it has.
#[test]
fn gdpo_reads_the_reward_functions_components() {
    let dir = scratch("trainer_gdpo");
    let path = format!(
        "reward.custom_reward_function.path={}",
        fixture("reward_components.py").display()
    );
    // GDPO (verl 0.7.1's estimator, 0.8's reward manager): on the newest release's tree.
    let cfg = small_grpo_on(
        &dir,
        2,
        &[
            &path,
            "algorithm.adv_estimator=gdpo",
            "reward.reward_manager.name=gdpo",
            "actor_rollout_ref.rollout.n=4",
            "+algorithm.gdpo_reward_keys=[accuracy_reward,format_reward,tagged]",
            "+algorithm.gdpo_reward_weights=[1.0,0.5,0.1]",
        ],
        verlc_front::load::version::BuiltinRelease::V0_9_1,
    );
    assert!(matches!(
        cfg.reward_manager,
        verlc_spec::trainer::RewardManagerSpec::Gdpo { .. }
    ));
    let summary = verlc_runtime::trainer::run(&cfg, &quiet()).expect("runs");
    for (step, m) in &summary.history {
        // verl 0.9's GDPO manager passes `extra_info.experiment_name` to the scorer.
        assert_eq!(m["gdpo/tagged/mean"], 1.0, "step {step}");
        for key in ["accuracy_reward", "format_reward"] {
            let (lo, hi) = (m[&format!("gdpo/{key}/min")], m[&format!("gdpo/{key}/max")]);
            assert!(
                (0.0..=1.0).contains(&lo) && lo <= hi && hi <= 1.0,
                "step {step}: {key}"
            );
            assert!(m[&format!("gdpo/{key}/std")] >= 0.0);
        }
        assert!(
            m["critic/advantages/mean"].abs() < 1e-5,
            "step {step}: whitened"
        );
    }
    let cfg = small_grpo_on(
        &dir,
        1,
        &[
            &path,
            "algorithm.adv_estimator=gdpo",
            "reward.reward_manager.name=gdpo",
            "+algorithm.gdpo_reward_keys=[length_reward]",
        ],
        verlc_front::load::version::BuiltinRelease::V0_9_1,
    );
    let err = verlc_runtime::trainer::run(&cfg, &quiet())
        .expect_err("no such component")
        .to_string();
    assert!(
        err.contains("length_reward") && err.contains("accuracy_reward"),
        "{err}"
    );
}

/// DAPO's dynamic sampling (`algorithm.filter_groups`): with half the prompts scoring the same
/// for every response, each step drops their groups, refills from the sampler and trains on
/// exactly `train_batch_size` groups, every one of which varies (read back from the rollout
/// dump). On a reward that never varies, `max_num_gen_batches` stops the run with the counts.
#[test]
fn dynamic_sampling_trains_only_groups_that_vary() {
    let dir = scratch("trainer_dapo");
    let path = format!(
        "custom_reward_function.path={}",
        fixture("reward_dapo.py").display()
    );
    let dump = dir.join("rollouts");
    let dump_arg = format!("trainer.rollout_data_dir={}", dump.display());
    for metric in ["reward", "acc"] {
        let metric_arg = format!("+algorithm.filter_groups.metric={metric}");
        let cfg = small_grpo(
            &dir,
            2,
            &[
                &path,
                &dump_arg,
                "actor_rollout_ref.rollout.n=4",
                "+algorithm.filter_groups.enable=true",
                &metric_arg,
            ],
        );
        let summary = verlc_runtime::trainer::run(&cfg, &quiet()).expect("runs");
        for (step, m) in &summary.history {
            let rounds = m["training/filter_groups/num_gen_batches"];
            let evicted = m["training/filter_groups/evicted_samples"];
            assert!(
                rounds >= 2.0 && evicted >= 1.0,
                "{metric} step {step}: {m:?}"
            );
            let text = std::fs::read_to_string(dump.join(format!("{step}.jsonl"))).expect("dump");
            let rows: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).expect("json"))
                .collect();
            assert_eq!(
                rows.len(),
                8 * 4,
                "{metric} step {step}: train_batch_size x n rows"
            );
            let mut groups: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
            for r in &rows {
                groups
                    .entry(r["input"].as_str().expect("input").to_owned())
                    .or_default()
                    .push(r["score"].as_f64().expect("score"));
            }
            assert_eq!(groups.len(), 8, "{metric} step {step}");
            if metric == "reward" {
                for (prompt, scores) in &groups {
                    assert!(
                        scores.iter().any(|s| *s != scores[0]),
                        "step {step}: a flat group trained: {prompt} {scores:?}"
                    );
                }
            }
        }
    }
    let cfg = small_grpo(
        &dir,
        1,
        &[
            &path,
            "+custom_reward_function.reward_kwargs={constant: true}",
            "actor_rollout_ref.rollout.n=4",
            "+algorithm.filter_groups.enable=true",
            "+algorithm.filter_groups.metric=reward",
            "+algorithm.filter_groups.max_num_gen_batches=3",
        ],
    );
    let err = verlc_runtime::trainer::run(&cfg, &quiet())
        .expect_err("no group ever varies")
        .to_string();
    assert!(
        err.contains("after 3 generation rounds only 0 of 8"),
        "{err}"
    );
}
