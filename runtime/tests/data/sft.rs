//! `verlc_runtime::data::sft` against verl's own `MultiTurnSFTDataset` (every carried release from
//! 0.7.0 to 0.9.1, run by tests/oracle/sft_data_oracle.py on pyarrow files with transformers'
//! tokenizers): the same tokens and loss masks for every row, tokenizer (a Qwen2.5 template with
//! a default system prompt, a Qwen3-style one with thinking) and option set (truncation, the
//! mismatch escape, template arguments, thinking per row and by default), and an error where
//! verl raises one.

use std::path::PathBuf;

use serde_json::Value;
use verlc_runtime::data::files;
use verlc_runtime::data::sft::{
    AlgoRelease, ChatPrompts, Conversation, ConversationError, SftDataset, SftOptions, Truncation,
};
use verlc_runtime::tokenizer::Tokenizer;

use crate::oracle;

fn sft_oracle() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let t = oracle::script_named("");
        oracle::cached_with(
            &oracle::script_named("sft_data_oracle.py"),
            "sft",
            &[
                &t.join("model_oracle.py"),
                &t.join("qwen2_5_chat_template.jinja"),
                &t.join("qwen3_style_chat_template.jinja"),
            ],
        )
    })
    .clone()
}

fn release(name: &str) -> AlgoRelease {
    let v: Vec<u32> = name
        .split('.')
        .map(|p| p.parse().expect("release"))
        .collect();
    AlgoRelease(v[0], v[1], v[2])
}

/// The dataset options of one of the oracle's configs.
fn options(config: &Value, release_name: &str) -> SftOptions {
    let mut o = SftOptions {
        release: release(release_name),
        ..SftOptions::default()
    };
    if let Some(n) = config["max_length"].as_u64() {
        o.max_length = n as usize;
    }
    o.truncation = match config["truncation"].as_str() {
        Some("left") => Truncation::Left,
        Some("right") => Truncation::Right,
        _ => Truncation::Error,
    };
    o.ignore_input_ids_mismatch = config["ignore_input_ids_mismatch"] == Value::Bool(true);
    o.enable_thinking_default = config["enable_thinking_default"].as_bool();
    if let Some(k) = config["apply_chat_template_kwargs"].as_object() {
        o.chat_template_kwargs = k.clone();
    }
    o
}

/// verl's tokens and loss mask of an encoded row.
fn ids_and_mask(want: &Value) -> (Vec<i64>, Vec<bool>) {
    let ids: Vec<i64> = serde_json::from_value(want["input_ids"].clone()).expect("ids");
    let mask: Vec<bool> = want["loss_mask"]
        .as_array()
        .expect("mask")
        .iter()
        .map(|m| m.as_i64() == Some(1))
        .collect();
    (ids, mask)
}

/// A row verl 0.7.0 cannot read: with two tool calls in one message, its dataset hands the
/// template numpy arrays and fails on their truth value (0.7.1 converts them). Ours reads the
/// row as 0.7.1 does (here: the template renders it differently whole, a refusal).
fn verl_0_7_0_numpy_failure(row: &Value) -> bool {
    row["message"]
        .as_str()
        .is_some_and(|m| m.contains("truth value of an array"))
}

#[test]
fn conversations_encode_as_verls_sft_dataset_does() {
    let dir = sft_oracle();
    let cases = oracle::json(&dir.join("expected.json"));
    let cases = cases.as_array().expect("cases");
    assert_eq!(
        cases.len(),
        5 * 2 * 3 * 7,
        "releases x tokenizers x files x options"
    );
    let (mut encoded, mut refused) = (0, 0);
    let mut wrong = Vec::new();
    for case in cases {
        let rel = case["release"].as_str().expect("release");
        let tok_name = case["tokenizer"].as_str().expect("tokenizer");
        let file = dir.join(format!("{}.parquet", case["file"].as_str().expect("file")));
        let tok = Tokenizer::from_dir(&dir.join(tok_name)).expect("tokenizer");
        let opts = options(&case["config"], rel);
        let prompts = ChatPrompts::for_options(&tok, &opts).expect("prompts");
        let label = format!(
            "{rel} {tok_name} {} {}",
            case["file"].as_str().unwrap_or_default(),
            case["options"].as_str().unwrap_or_default()
        );
        let rows = files::read_rows(&file.display().to_string()).expect("rows");
        let want_rows = case["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), want_rows.len(), "{label}");
        for (i, (row, want)) in rows.into_iter().zip(want_rows).enumerate() {
            if verl_0_7_0_numpy_failure(want) {
                continue;
            }
            let got = Conversation::from_row(row, &opts)
                .expect("row")
                .encode(&tok, &prompts, &opts);
            match (want.get("error").and_then(Value::as_str), got) {
                (Some(kind), Err(e)) => {
                    let ours = match e {
                        ConversationError::TooLong { .. } => "ValueError",
                        ConversationError::Mismatch { .. } => "AssertionError",
                        ConversationError::Tokenizer(_) | ConversationError::NoEosToken => "other",
                    };
                    if ours != kind {
                        wrong.push(format!("{label} row {i}: verl {kind}, ours: {e}"));
                    }
                    refused += 1;
                }
                (Some(kind), Ok(_)) => wrong.push(format!(
                    "{label} row {i}: verl raises {kind}, ours encodes it"
                )),
                (None, Err(e)) => {
                    wrong.push(format!("{label} row {i}: verl encodes it, ours: {e}"))
                }
                (None, Ok(enc)) => {
                    let (ids, mask) = ids_and_mask(want);
                    let pos: Vec<i64> =
                        serde_json::from_value(want["position_ids"].clone()).expect("pos");
                    if enc.input_ids != ids {
                        wrong.push(format!(
                            "{label} row {i}: input_ids\n  verl {ids:?}\n  ours {:?}",
                            enc.input_ids
                        ));
                    } else if enc.loss_mask != mask {
                        wrong.push(format!(
                            "{label} row {i}: loss_mask\n  verl {mask:?}\n  ours {:?}",
                            enc.loss_mask
                        ));
                    } else if pos != (0..ids.len() as i64).collect::<Vec<_>>() {
                        wrong.push(format!(
                            "{label} row {i}: verl's position ids are not 0..len"
                        ));
                    }
                    encoded += 1;
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} differences:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        encoded > 300 && refused > 50,
        "{encoded} rows compared, {refused} refusals"
    );
}

/// The dataset over a file: every row, what it noticed, and a bad row named by file and row.
#[test]
fn the_dataset_loads_rows_in_order_and_names_the_row_it_refuses() {
    let dir = sft_oracle();
    let tok = Tokenizer::from_dir(&dir.join("tok1")).expect("tokenizer");
    let tools = dir.join("tools.parquet").display().to_string();
    let plain = dir.join("plain.parquet").display().to_string();

    let lenient = SftOptions {
        ignore_input_ids_mismatch: true,
        max_length: 4096,
        ..SftOptions::default()
    };
    let ds = SftDataset::load(&[plain.clone(), tools.clone()], &tok, &lenient).expect("load");
    assert_eq!(ds.len(), 6);
    assert_eq!(
        ds.mismatched, 1,
        "two tool answers in a row render as one turn"
    );
    assert!(
        ds.warnings("data.train_files")
            .iter()
            .any(|w| w.starts_with("data.train_files: 1 conversation(s) tokenize differently")),
        "{:?}",
        ds.warnings("data.train_files")
    );
    assert_eq!(ds.examples[4].source, tools);
    assert_eq!(ds.examples[4].row, 0);
    assert!(
        ds.examples
            .iter()
            .all(|e| e.loss_tokens() > 0 || e.row == 3)
    );

    let strict = SftOptions {
        max_length: 4096,
        ..SftOptions::default()
    };
    let e = SftDataset::load(std::slice::from_ref(&tools), &tok, &strict)
        .expect_err("the mismatching row")
        .to_string();
    assert!(
        e.contains("tools.parquet: row 1:") && e.contains("ignore_input_ids_mismatch"),
        "{e}"
    );

    // verl masks as many tokens as the generation prompt has; with `enable_thinking: false`
    // that prompt holds an empty think block a lone assistant message does not render, and
    // the dataset says how many turns that affects.
    let no_thinking = SftOptions {
        max_length: 4096,
        chat_template_kwargs: [("enable_thinking".to_owned(), Value::Bool(false))]
            .into_iter()
            .collect(),
        ..SftOptions::default()
    };
    let ds = SftDataset::load(&[plain], &tok, &no_thinking).expect("load");
    assert_eq!(
        ds.turns_without_prompt, 5,
        "every assistant turn of plain.parquet"
    );
    // The trainer says so before it trains.
    let w = ds.warnings("data.train_files");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("data.train_files: 5 assistant turn(s)") && w[0].contains("masks"),
        "{w:?}"
    );
}

/// verl 0.7.0's legacy SFT trainer's data, against its own datasets: the single-turn
/// `SFTDataset` (columns, and gsm8k's `extra_info` dict keys; truncation error, right and
/// left; template arguments) and the multi-turn dataset in its default right-padded mode,
/// where `truncation` is obeyed. verl's padding is cut off (it never reaches the loss).
#[test]
fn legacy_trainer_rows_encode_as_verl_0_7_0s_datasets_do() {
    use verlc_runtime::data::sft::{SftFormat, SftPadding};
    use verlc_runtime::data::sft_single_turn::PromptResponse;
    use verlc_spec::sft::SingleTurnKeys;
    let dir = sft_oracle();
    let cases = oracle::json(&dir.join("legacy.json"));
    let cases = cases.as_array().expect("cases");
    assert_eq!(
        cases.len(),
        2 * (2 * 5 + 3 * 3),
        "tokenizers x (single x multi)"
    );
    let (mut encoded, mut refused) = (0, 0);
    let mut wrong = Vec::new();
    for case in cases {
        let config = &case["config"];
        let tok_name = case["tokenizer"].as_str().expect("tokenizer");
        let tok = Tokenizer::from_dir(&dir.join(tok_name)).expect("tokenizer");
        let mut opts = options(config, "0.7.0");
        opts.padding = SftPadding::Right;
        let single = case["format"] == "single_turn";
        let strings = |k: &str| -> Vec<String> {
            config[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        if single {
            opts.format = SftFormat::SingleTurn(SingleTurnKeys {
                prompt_key: config["prompt_key"].as_str().expect("prompt_key").into(),
                response_key: config["response_key"]
                    .as_str()
                    .expect("response_key")
                    .into(),
                prompt_dict_keys: strings("prompt_dict_keys"),
                response_dict_keys: strings("response_dict_keys"),
            });
        }
        let prompts = ChatPrompts::for_options(&tok, &opts).expect("prompts");
        let file = case["file"].as_str().unwrap_or_default();
        let label = format!(
            "{tok_name} {file} {}",
            case["options"].as_str().unwrap_or_default()
        );
        let rows = files::read_rows(&dir.join(file).display().to_string()).expect("rows");
        let want_rows = case["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), want_rows.len(), "{label}");
        for (i, (row, want)) in rows.into_iter().zip(want_rows).enumerate() {
            if verl_0_7_0_numpy_failure(want) {
                continue;
            }
            let got = match &opts.format {
                SftFormat::SingleTurn(keys) => PromptResponse::from_row(&row, keys)
                    .expect("row")
                    .encode(&tok, &opts),
                SftFormat::MultiTurn => Conversation::from_row(row, &opts)
                    .expect("row")
                    .encode(&tok, &prompts, &opts),
            };
            match (want.get("error").and_then(Value::as_str), got) {
                (Some(kind), Err(ConversationError::TooLong { .. }))
                    if kind == "NotImplementedError" || kind == "ValueError" =>
                {
                    refused += 1
                }
                (Some(kind), other) => wrong.push(format!(
                    "{label} row {i}: verl raises {kind}, ours {other:?}"
                )),
                (None, Err(e)) => {
                    wrong.push(format!("{label} row {i}: verl encodes it, ours: {e}"))
                }
                (None, Ok(enc)) => {
                    let (ids, mask) = ids_and_mask(want);
                    if enc.input_ids != ids {
                        wrong.push(format!(
                            "{label} row {i}: input_ids\n  verl {ids:?}\n  ours {:?}",
                            enc.input_ids
                        ));
                    } else if enc.loss_mask[1..] != mask[1..] {
                        // The first token's mask never weighs a log-probability.
                        wrong.push(format!(
                            "{label} row {i}: loss_mask\n  verl {mask:?}\n  ours {:?}",
                            enc.loss_mask
                        ));
                    }
                    encoded += 1;
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} differences:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        encoded > 80 && refused > 10,
        "{encoded} rows compared, {refused} refusals"
    );
}
