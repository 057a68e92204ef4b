//! Reward manager classes run in Python as verl runs them: the user's classes of both of verl's
//! shapes (`reward_manager.source: importlib`) and verl's own registered `batch` manager. A
//! manager that scores as verl's naive one does trains exactly as verlc's naive manager; the
//! reward keyword arguments reach the constructor; a broken class is reported with its
//! traceback.

use std::path::PathBuf;

use verlc_runtime::trainer::run;

use crate::support::{quiet, repo, scratch, series, small_grpo};

fn fixture(name: &str) -> PathBuf {
    repo().join("runtime/tests/trainer/fixtures").join(name)
}

const KEYS: [&str; 4] = [
    "critic/score/mean",
    "actor/pg_loss",
    "actor/grad_norm",
    "response_length/mean",
];

fn run_with(dir: &str, steps: u64, extra: &[String]) -> Vec<Vec<f64>> {
    let mut o = vec![format!(
        "custom_reward_function.path={}",
        fixture("reward_fn.py").display()
    )];
    o.extend(extra.iter().cloned());
    let o: Vec<&str> = o.iter().map(String::as_str).collect();
    let spec = small_grpo(&scratch(dir), steps, &o);
    let summary = run(&spec, &quiet()).expect("run");
    // Prompts of about 13 tokens under the quickstart's max_prompt_length of 32: none is at the limit,
    // though each batch pads them to its longest.
    assert!(
        series(&summary.history, "prompt_length/clip_ratio")
            .iter()
            .all(|&r| r == 0.0),
        "prompt clip ratio measured against data.max_prompt_length"
    );
    KEYS.iter().map(|k| series(&summary.history, k)).collect()
}

fn importlib(name: &str) -> Vec<String> {
    vec![
        "reward_manager.source=importlib".into(),
        format!(
            "reward_manager.module.path={}",
            fixture("reward_managers.py").display()
        ),
        format!("reward_manager.name={name}"),
    ]
}

#[test]
fn python_reward_managers_train_as_verl_runs_them() {
    let naive = run_with("rm_naive", 2, &[]);
    assert_eq!(naive[0].len(), 2);
    // Both of verl's manager shapes, scoring as the naive manager: the same run.
    for name in ["LastTokenManager", "RowManager"] {
        let got = run_with(&format!("rm_{name}"), 2, &importlib(name));
        assert_eq!(got, naive, "{name}: {KEYS:?}");
    }
    // The manager's own keyword arguments (`reward_kwargs`) reach its constructor: an offset
    // split between the first and the last token.
    let mut o = importlib("OffsetManager");
    o.push("+reward_model.reward_kwargs.offset=0.5".into());
    let offset = run_with("rm_offset", 1, &o);
    assert!(
        (offset[0][0] - (naive[0][0] + 0.5)).abs() < 1e-6,
        "offset manager step 1 score {} vs naive {} + 0.5",
        offset[0][0],
        naive[0][0]
    );
    // verl's own `batch` manager, with a reward keyword argument for the function.
    let mut o = vec![
        "reward_model.reward_manager=batch".to_owned(),
        format!(
            "custom_reward_function.path={}",
            fixture("reward_batched.py").display()
        ),
        "+custom_reward_function.reward_kwargs.offset=0.25".into(),
    ];
    o.push("reward_manager.name=batch".into());
    let batch = run_with("rm_batch", 1, &o);
    assert!(
        (batch[0][0] - (naive[0][0] + 0.25)).abs() < 1e-6,
        "batch manager step 1 score {} vs naive {} + 0.25",
        batch[0][0],
        naive[0][0]
    );
}

#[test]
fn a_broken_reward_manager_is_reported_with_its_traceback() {
    let o: Vec<String> = importlib("NoSuchManager")
        .into_iter()
        .chain([format!(
            "custom_reward_function.path={}",
            fixture("reward_fn.py").display()
        )])
        .collect();
    let o: Vec<&str> = o.iter().map(String::as_str).collect();
    let spec = small_grpo(&scratch("rm_broken"), 1, &o);
    let text = run(&spec, &quiet()).expect_err("no such class").to_string();
    assert!(
        text.contains("reward manager `NoSuchManager` from")
            && text.contains("has no attribute 'NoSuchManager'"),
        "{text}"
    );
}
