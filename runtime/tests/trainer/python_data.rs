//! The user's Python dataset (`data.custom_cls`) and sampler (`data.sampler.class_path`)
//! classes, run as verl runs them: a dataset class trains exactly as its rows written as a
//! data file do; broken classes are reported with their traceback or the item at fault. (A
//! curriculum sampler over two ranks: `distributed::python_classes_on_two_ranks...`.)

use std::path::{Path, PathBuf};

use serde_json::json;
use verlc_runtime::data::files::read_rows;
use verlc_runtime::trainer::{TrainerError, run};

use crate::support::{is_timing, quiet, repo, scratch, small_grpo};

pub fn fixture(name: &str) -> String {
    repo()
        .join("runtime/tests/trainer/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// The quickstart's prompts in two files: `raw.json` (JSON lines) in the dataset class's own layout
/// (question, answer, source, difficulty) and `rows.json` in verl's RL format, as the class
/// turns them.
pub fn write_data(dir: &Path, rows: usize) -> (PathBuf, PathBuf) {
    let src = read_rows("builtin://digit_reversal?split=train&min_digits=3&max_digits=3&size=64")
        .expect("builtin rows");
    let (mut raw, mut verl) = (String::new(), String::new());
    for (i, r) in src.iter().take(rows).enumerate() {
        let question = r["prompt"][0]["content"].as_str().expect("content");
        let answer = r["reward_model"]["ground_truth"].as_str().expect("answer");
        let source = r["data_source"].as_str().expect("source");
        // Difficulty: the digit sum, so the curriculum's order is not the file's.
        let difficulty: u32 = answer.chars().filter_map(|c| c.to_digit(10)).sum();
        raw.push_str(&format!(
            "{}\n",
            json!({"question": question, "answer": answer, "source": source, "difficulty": difficulty})
        ));
        verl.push_str(&format!(
            "{}\n",
            json!({
                "data_source": source,
                "prompt": [{"role": "user", "content": question}],
                "ability": "reversal",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"index": i, "difficulty": difficulty},
            })
        ));
    }
    let (a, b) = (dir.join("raw.json"), dir.join("rows.json"));
    std::fs::write(&a, raw).expect("write raw");
    std::fs::write(&b, verl).expect("write rows");
    (a, b)
}

fn training_metrics(
    history: &[(u64, verlc_runtime::engine::Metrics)],
) -> Vec<(u64, Vec<(String, f64)>)> {
    history
        .iter()
        .map(|(s, m)| {
            let mut v: Vec<(String, f64)> = m
                .iter()
                .filter(|(k, _)| !is_timing(k))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            (*s, v)
        })
        .collect()
}

#[test]
fn a_dataset_class_trains_as_its_rows_written_as_a_file() {
    let dir = scratch("python_dataset");
    let (raw, rows) = write_data(&dir, 32);
    let files = |f: &Path| {
        vec![
            format!("data.train_files={}", f.display()),
            format!("data.val_files={}", f.display()),
        ]
    };
    let mut with_class = files(&raw);
    with_class.push(format!(
        "data.custom_cls.path={}",
        fixture("reversal_dataset.py")
    ));
    with_class.push("data.custom_cls.name=ReversalDataset".into());
    let as_file = files(&rows);
    let run_with = |name: &str, o: &[String]| {
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        let spec = small_grpo(&dir.join(name), 2, &o);
        run(&spec, &quiet()).expect("run")
    };
    let a = run_with("class", &with_class);
    let b = run_with("file", &as_file);
    assert_eq!(a.last_step, 2);
    assert_eq!(training_metrics(&a.history), training_metrics(&b.history));
}

#[test]
fn broken_dataset_classes_are_named_with_their_cause() {
    let dir = scratch("python_dataset_broken");
    let (raw, _) = write_data(&dir, 16);
    let attempt = |path: &str, name: &str| {
        let o = [
            format!("data.train_files={}", raw.display()),
            "data.val_files=[]".to_owned(),
            format!("data.custom_cls.path={path}"),
            format!("data.custom_cls.name={name}"),
        ];
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        let spec = small_grpo(&dir.join(name), 1, &o);
        match run(&spec, &quiet()) {
            Ok(_) => panic!("{name}: trained"),
            Err(e) => e,
        }
    };
    let e = attempt(&fixture("reversal_dataset.py"), "NoSuchClass");
    assert!(matches!(e, TrainerError::Data(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("data.custom_cls `NoSuchClass`")
            && text.contains("has no attribute 'NoSuchClass'"),
        "{text}"
    );
    let text = attempt(&fixture("reversal_dataset.py"), "NoRawPrompt").to_string();
    assert!(
        text.contains("NoRawPrompt (train dataset): row 0: the item has no `raw_prompt`")
            && text.contains("(and 15 more rows like it)"),
        "{text}"
    );
    let missing = dir.join("nowhere.py").display().to_string();
    let text = attempt(&missing, "ReversalDataset").to_string();
    assert!(
        text.contains("no such file: ") && text.contains("nowhere.py"),
        "{text}"
    );
}

/// A dataset class for a vision-language model (the tiny Qwen2.5-VL on the pictures task):
/// its items carry their pictures inside the messages, as verl's RLHFDataset puts them (PIL
/// images in image parts); they reach the trainer as PNG cells and train exactly as the same
/// rows read from the data files do (the same pictures through the same processing, the same
/// prompt ids).
#[test]
fn a_dataset_class_with_pictures_trains_as_its_rows_read_as_files() {
    let dir = scratch("python_dataset_pictures");
    let files = [
        "data.train_files='builtin://color_digits?split=train&size=32&stripes=2'",
        "data.val_files='builtin://color_digits?split=test&size=8&stripes=2'",
        "data.image_key=images",
        "data.max_prompt_length=64",
        "data.max_response_length=3",
        "actor_rollout_ref.model.path='builtin://tiny?arch=qwen2_5_vl&layers=2&hidden=64&heads=4&kv_heads=2'",
    ];
    let path = format!("data.custom_cls.path={}", fixture("pictures_dataset.py"));
    let run_with = |name: &str, extra: &[&str]| {
        let mut o = files.to_vec();
        o.extend_from_slice(extra);
        let spec = small_grpo(&dir.join(name), 2, &o);
        run(&spec, &quiet()).expect("run")
    };
    let a = run_with(
        "class",
        &[path.as_str(), "data.custom_cls.name=PicturesDataset"],
    );
    let b = run_with("file", &[]);
    assert_eq!(a.last_step, 2);
    assert_eq!(training_metrics(&a.history), training_metrics(&b.history));
}
