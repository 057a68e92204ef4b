//! The user's agent loops (`rollout.agent.agent_loop_config_path`), run in Python as verl runs
//! them while verlc's rollout generates: a loop that does what verl's single-turn loop does
//! trains exactly as `single_turn_agent`; a loop that adds its own masked turn trains with its
//! turn count; a loop that scores its own rows trains on those scores; a loop the file does not
//! register is refused before training.

use verlc_runtime::trainer::run;

use crate::support::{is_timing, quiet, repo, scratch, series, small_grpo};

fn loops(default: &str) -> Vec<String> {
    vec![
        format!(
            "actor_rollout_ref.rollout.agent.agent_loop_config_path={}",
            repo()
                .join("runtime/tests/trainer/fixtures/agent_loops.yaml")
                .display()
        ),
        format!("actor_rollout_ref.rollout.agent.default_agent_loop={default}"),
    ]
}

fn training(history: &[(u64, verlc_runtime::engine::Metrics)]) -> Vec<Vec<(String, f64)>> {
    history
        .iter()
        .map(|(_, m)| {
            m.iter()
                .filter(|(k, _)| !is_timing(k))
                .map(|(k, v)| (k.clone(), *v))
                .collect()
        })
        .collect()
}

/// Two steps of verl's single-turn loop (verlc's own), which the loops below that do the same
/// must train as: run once for the tests of this file.
fn native_single_turn() -> &'static [Vec<(String, f64)>] {
    static NATIVE: std::sync::OnceLock<Vec<Vec<(String, f64)>>> = std::sync::OnceLock::new();
    NATIVE.get_or_init(|| {
        let o = [
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
        ];
        let native = run(&small_grpo(&scratch("loops_native"), 2, &o), &quiet()).expect("run");
        training(&native.history)
    })
}

#[test]
fn python_agent_loops_generate_through_verlcs_rollout() {
    let run_with = |name: &str, steps: u64, o: &[String]| {
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        run(&small_grpo(&scratch(name), steps, &o), &quiet()).expect("run")
    };
    let mine = run_with("loops_single", 2, &loops("my_single_turn"));
    assert_eq!(training(&mine.history), native_single_turn());

    let two = run_with("loops_two", 1, &loops("two_turns"));
    assert_eq!(series(&two.history, "num_turns/mean"), vec![4.0]);
}

/// A loop written for verl 0.9 tokenizes through verl's Continuous Token builder
/// (`ct_build_initial_tokens`, `ct_merge_assistant_token`), which the helper takes from the verl
/// beside it, as verl's base class does: with verl 0.9.1 there (its tree from `scripts/setup`
/// first on the interpreter's path), the loop trains exactly as verl's single-turn loop; with
/// the venv's verl 0.7.0, which has no builder, its first `ct_` call is an error that says so.
#[test]
fn a_verl_0_9_loop_tokenizes_through_verls_continuous_token_builder() {
    let dir = scratch("loops_continuous");
    let verl = repo().join(".venv/verl-releases/0.9.1");
    assert!(
        verl.join("verl/utils/tokenizer/continuous_token_wiring.py")
            .is_file(),
        "verl 0.9.1's tree (scripts/setup) at {}",
        verl.display()
    );
    let python = dir.join("python-verl-0.9.1");
    std::fs::write(
        &python,
        format!(
            "#!/bin/sh\nPYTHONPATH={}${{PYTHONPATH:+:$PYTHONPATH}} exec {} \"$@\"\n",
            verl.display(),
            verlc_runtime::workers::reward::python::PythonSettings::default_python()
        ),
    )
    .expect("wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let with_0_9 = verlc_runtime::trainer::RunOptions {
        reward_python: Some(python.display().to_string()),
        ..quiet()
    };
    let plain = quiet();
    let steps = |name: &str, o: &[String], opts: &verlc_runtime::trainer::RunOptions| {
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        run(&small_grpo(&scratch(name), 2, &o), opts)
    };
    let continuous = steps(
        "loops_continuous_0_9",
        &loops("continuous_single_turn"),
        &with_0_9,
    )
    .expect("a verl 0.9 loop with verl 0.9.1");
    assert_eq!(training(&continuous.history), native_single_turn());
    let err = steps(
        "loops_continuous_0_7",
        &loops("continuous_single_turn"),
        &plain,
    )
    .expect_err("no builder in verl 0.7.0")
    .to_string();
    assert!(
        err.contains("ct_build_initial_tokens is verl 0.9's Continuous Token API"),
        "{err}"
    );
}

/// An `AgentLoopOutput` with its own `reward_score` (0.25 for an even response length, 0.75
/// for an odd one): verl scores the batch with those instead of the reward function, and so
/// does verlc, in training and in validation.
#[test]
fn a_loop_that_scores_its_rows_trains_on_its_scores() {
    let mut o = loops("self_scored");
    o.push("trainer.val_before_train=true".to_owned());
    let o: Vec<&str> = o.iter().map(String::as_str).collect();
    let out = run(&small_grpo(&scratch("loops_scored"), 1, &o), &quiet()).expect("run");
    let one = |key: &str| series(&out.history, key);
    for (key, values) in [
        ("critic/score/max", one("critic/score/max")),
        ("critic/score/min", one("critic/score/min")),
    ] {
        assert_eq!(values.len(), 1, "{key}");
        assert!(values[0] == 0.25 || values[0] == 0.75, "{key}: {values:?}");
    }
    // The mean is the loop's scores' mean: (0.25 * even + 0.75 * odd) / rows.
    let lengths = one("response_length/mean");
    let mean = one("critic/score/mean");
    assert!((0.25..=0.75).contains(&mean[0]), "{mean:?} ({lengths:?})");
    let val: Vec<f64> = out
        .history
        .iter()
        .flat_map(|(_, m)| m.iter())
        .filter(|(k, _)| k.starts_with("val-core/") && k.ends_with("/mean@1"))
        .map(|(_, v)| *v)
        .collect();
    assert!(
        !val.is_empty() && val.iter().all(|v| (0.25..=0.75).contains(v)),
        "{val:?}"
    );
}

#[test]
fn an_unregistered_agent_loop_is_refused_before_training() {
    let o = loops("nobody");
    let o: Vec<&str> = o.iter().map(String::as_str).collect();
    let text = run(&small_grpo(&scratch("loops_none"), 1, &o), &quiet())
        .expect_err("no such loop")
        .to_string();
    assert!(
        text.contains("`nobody` is neither one of verl's loops nor registered")
            && text.contains("my_single_turn, self_scored, two_turns"),
        "{text}"
    );
}
