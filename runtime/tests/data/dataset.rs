//! Prompt preparation: chat template + tokenization, truncation modes, filtering of over-long
//! prompts, max_samples subsets.

use verlc_runtime::data::dataset::truncate;
use verlc_runtime::data::{DatasetOptions, RlDataset, Truncation};
use verlc_runtime::tokenizer::Tokenizer;

use crate::parquet_dir;

fn files() -> Vec<String> {
    let d = parquet_dir();
    vec![
        d.join("train.parquet").display().to_string(),
        d.join("other.parquet").display().to_string(),
    ]
}

#[test]
fn truncation_modes() {
    let ids: Vec<i64> = (0..10).collect();
    assert_eq!(truncate(&ids, 4, Truncation::Left), Some(vec![6, 7, 8, 9]));
    assert_eq!(truncate(&ids, 4, Truncation::Right), Some(vec![0, 1, 2, 3]));
    assert_eq!(
        truncate(&ids, 5, Truncation::Middle),
        Some(vec![0, 1, 7, 8, 9])
    );
    assert_eq!(truncate(&ids, 4, Truncation::Error), None);
    assert_eq!(truncate(&ids, 10, Truncation::Error), Some(ids.clone()));
    let t: Truncation = serde_json::from_str("\"middle\"").unwrap();
    assert_eq!(t, Truncation::Middle);
}

#[test]
fn overlong_prompts_error_filter_or_truncate() {
    let tok = Tokenizer::from_pretrained("builtin://tiny").unwrap();
    let base = DatasetOptions {
        max_prompt_length: 40,
        ..DatasetOptions::default()
    };
    let e = RlDataset::load(&files(), &tok, &base)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("train.parquet: row 0") && e.contains("max_prompt_length = 40"),
        "{e}"
    );

    let filtered = RlDataset::load(
        &files(),
        &tok,
        &DatasetOptions {
            filter_overlong_prompts: true,
            ..base.clone()
        },
    )
    .unwrap();
    assert!(filtered.filtered >= 1);
    assert_eq!(filtered.len() + filtered.filtered, 7);
    // The error counted every prompt the filter drops, not only the first.
    if filtered.filtered > 1 {
        let n = filtered.filtered;
        assert!(
            e.contains(&format!("{n} rows cannot be used"))
                && e.contains(&format!("(and {} more rows like it)", n - 1)),
            "{e}"
        );
    } else {
        assert!(!e.contains("rows cannot be used"), "{e}");
    }
    assert!(filtered.items.iter().all(|it| it.input_ids.len() <= 40));
    let long = filtered.items.iter().find(|it| it.sample.index == 7);
    assert!(long.is_none(), "the 280-character prompt is dropped");

    let left = RlDataset::load(
        &files(),
        &tok,
        &DatasetOptions {
            truncation: Truncation::Left,
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!(left.len(), 7);
    let item = &left.items[2];
    assert_eq!(item.input_ids.len(), 40);
    let tail = tok
        .encode("<|im_end|>\n<|im_start|>assistant\n", false)
        .unwrap();
    assert!(
        item.input_ids.ends_with(&tail),
        "left truncation keeps the generation prompt"
    );
    assert_eq!(
        (item.source.ends_with("train.parquet"), item.row),
        (true, 2)
    );
}

#[test]
fn max_samples_subsets() {
    let tok = Tokenizer::from_pretrained("builtin://tiny").unwrap();
    let opts = DatasetOptions {
        max_prompt_length: 512,
        max_samples: Some(3),
        shuffle: false,
        ..DatasetOptions::default()
    };
    let first = RlDataset::load(&files(), &tok, &opts).unwrap();
    assert_eq!(
        first
            .items
            .iter()
            .map(|i| i.sample.index)
            .collect::<Vec<_>>(),
        vec![0, 1, 7]
    );
    let a = RlDataset::load(
        &files(),
        &tok,
        &DatasetOptions {
            shuffle: true,
            seed: 5,
            ..opts.clone()
        },
    )
    .unwrap();
    let b = RlDataset::load(
        &files(),
        &tok,
        &DatasetOptions {
            shuffle: true,
            seed: 5,
            ..opts.clone()
        },
    )
    .unwrap();
    let idx = |d: &RlDataset| {
        d.items
            .iter()
            .map(|i| (i.source.clone(), i.row))
            .collect::<Vec<_>>()
    };
    assert_eq!(a.len(), 3);
    assert_eq!(idx(&a), idx(&b), "seeded subset is reproducible");
}

/// One load reports every bad row: each kind of problem at its first row, with how many more
/// rows share it, in file and row order.
#[test]
fn every_bad_row_is_reported_in_one_error() {
    let tok = Tokenizer::from_pretrained("builtin://tiny").unwrap();
    let dir = std::env::temp_dir().join(format!("verlc-bad-rows-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mixed.jsonl");
    let chat = |s: &str| serde_json::json!([{"role": "user", "content": s}]);
    let rows = [
        serde_json::json!({"prompt": chat("fine"), "data_source": "x"}),
        serde_json::json!({"prompt": "plain text", "data_source": "x"}),
        serde_json::json!({"prompt": chat("no source")}),
        serde_json::json!({"prompt": "more plain text", "data_source": "x"}),
        serde_json::json!({"prompt": chat("fine too"), "data_source": "x"}),
    ];
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&file, text).unwrap();
    let e = RlDataset::load(
        &[file.display().to_string()],
        &tok,
        &DatasetOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("3 rows cannot be used:"), "{e}");
    let lines: Vec<&str> = e.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "{e}");
    assert!(
        lines[0].contains("mixed.jsonl: row 1:")
            && lines[0].contains("`prompt`")
            && lines[0].ends_with("(and 1 more rows like it)"),
        "{e}"
    );
    assert!(
        lines[1].contains("mixed.jsonl: row 2:") && lines[1].contains("no column `data_source`"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
