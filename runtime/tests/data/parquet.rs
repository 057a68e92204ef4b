//! Parquet written by pyarrow in verl's layout is read back with every field.

use serde_json::Value;
use verlc_runtime::data::Sample;
use verlc_runtime::data::files::read_rows;

use crate::{oracle, parquet_dir};

#[test]
fn every_field_round_trips() {
    let dir = parquet_dir();
    for name in ["train", "other"] {
        let rows = read_rows(dir.join(format!("{name}.parquet")).to_str().unwrap()).unwrap();
        let want = oracle::json(&dir.join(format!("{name}.json")));
        let got = Value::Array(rows.into_iter().map(Value::Object).collect());
        assert_eq!(got, want, "{name}.parquet");
    }
}

#[test]
fn rows_become_typed_samples() {
    let dir = parquet_dir();
    let rows = read_rows(dir.join("train.parquet").to_str().unwrap()).unwrap();
    let samples: Vec<Sample> = rows
        .into_iter()
        .enumerate()
        .map(|(i, r)| Sample::from_row(r, "prompt", "data_source", i).unwrap())
        .collect();
    assert_eq!(samples.len(), 5);
    let s = &samples[1];
    assert_eq!(s.data_source, "openai/gsm8k");
    assert_eq!(s.prompt.len(), 2);
    assert_eq!(
        (s.prompt[0].role.as_str(), s.prompt[0].content.as_str()),
        ("system", Some("You are a careful solver.\nShow work."))
    );
    assert!(s.prompt[1].content.as_str().unwrap().contains("ünïcödé ✓"));
    assert_eq!(s.reward_model.style.as_deref(), Some("rule"));
    assert_eq!(s.ground_truth_str(), "10");
    assert_eq!(s.ability.as_deref(), Some("math"));
    assert_eq!(s.extra_info["answer"], "#### 10");
    assert_eq!(samples[2].index, 7, "index from extra_info");
    assert_eq!(samples[4].reward_model.style.as_deref(), Some("model"));

    let rows = read_rows(dir.join("other.parquet").to_str().unwrap()).unwrap();
    let s0 = Sample::from_row(rows[0].clone(), "prompt", "data_source", 0).unwrap();
    assert_eq!(
        s0.index, 0,
        "null extra_info.index falls back to the row number"
    );
    assert_eq!(s0.ability, None);
    assert_eq!(
        s0.reward_model.ground_truth["target"][1],
        "William Shakespeare"
    );
    let s1 = Sample::from_row(rows[1].clone(), "prompt", "data_source", 1).unwrap();
    assert_eq!(s1.extra_info["tools_kwargs"]["search"]["k"], 3);
}

#[test]
fn bad_rows_and_files_are_named() {
    let dir = parquet_dir();
    let rows = read_rows(dir.join("train.parquet").to_str().unwrap()).unwrap();
    let e = Sample::from_row(rows[0].clone(), "question", "data_source", 0).unwrap_err();
    assert!(e.contains("no column `question`"), "{e}");
    let e = Sample::from_row(rows[0].clone(), "prompt", "source", 0).unwrap_err();
    assert!(e.contains("no column `source`"), "{e}");
    let bogus = oracle::scratch("bogus").join("x.parquet");
    std::fs::write(&bogus, b"PAR1 definitely not parquet").unwrap();
    let e = read_rows(bogus.to_str().unwrap()).unwrap_err().to_string();
    assert!(e.contains("x.parquet"), "{e}");
    let e = read_rows("data.csv").unwrap_err().to_string();
    assert!(e.contains("unsupported file format"), "{e}");
}

#[test]
fn json_and_jsonl_files_read_like_parquet() {
    let dir = parquet_dir();
    let want = oracle::json(&dir.join("train.json"));
    let scratch = oracle::scratch("json-formats");
    let arr = scratch.join("rows.json");
    std::fs::write(&arr, want.to_string()).unwrap();
    let lines = scratch.join("rows.jsonl");
    let text: Vec<String> = want
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    std::fs::write(&lines, text.join("\n")).unwrap();
    for p in [arr, lines] {
        let rows = read_rows(p.to_str().unwrap()).unwrap();
        assert_eq!(
            Value::Array(rows.into_iter().map(Value::Object).collect()),
            want
        );
    }
}
