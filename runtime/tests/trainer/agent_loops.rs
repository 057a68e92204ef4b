//! The user's agent loops (`rollout.agent.agent_loop_config_path`), run in Python as verl runs
//! them while verlc's rollout generates: a loop that does what verl's single-turn loop does
//! trains exactly as `single_turn_agent`; a loop that adds its own masked turn trains with its
//! turn count; a loop the file does not register is refused before training.

use runtime::trainer::run;

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

fn training(history: &[(u64, runtime::engine::Metrics)]) -> Vec<Vec<(String, f64)>> {
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

#[test]
fn python_agent_loops_generate_through_verlcs_rollout() {
    let run_with = |name: &str, steps: u64, o: &[String]| {
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        run(&small_grpo(&scratch(name), steps, &o), &quiet()).expect("run")
    };
    let native = run_with(
        "loops_native",
        2,
        &[
            "actor_rollout_ref.rollout.multi_turn.enable=true".to_owned(),
            "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent".to_owned(),
        ],
    );
    let mine = run_with("loops_single", 2, &loops("my_single_turn"));
    assert_eq!(training(&mine.history), training(&native.history));

    let two = run_with("loops_two", 1, &loops("two_turns"));
    assert_eq!(series(&two.history, "num_turns/mean"), vec![4.0]);
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
            && text.contains("my_single_turn, two_turns"),
        "{text}"
    );
}
