//! Benchmark helper: writes what TRL needs to run the quickstart's GRPO step on the same
//! model shape, tokenizer, prompts and reward data as `examples/quickstart.yaml`: the
//! builtin tiny model's `config.json`, the builtin tokenizer's `tokenizer.json` and
//! `tokenizer_config.json` (with its chat template), and the training rows of the
//! quickstart's `builtin://digit_reversal` address as JSON lines (`prompt` messages,
//! `ground_truth`).
//!
//! Usage: grpo_export MODEL_URI DATA_URI OUT_DIR
use std::io::Write;

use verlc_runtime::builtin_uri::BuiltinUri;

type Error = Box<dyn std::error::Error>;

fn uri(s: &str) -> Result<BuiltinUri, Error> {
    Ok(BuiltinUri::parse(s).ok_or_else(|| format!("not a builtin:// address: {s}"))??)
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let [_, model, data, out] = args.as_slice() else {
        return Err("usage: grpo_export MODEL_URI DATA_URI OUT_DIR".into());
    };
    let out = std::path::Path::new(out);
    std::fs::create_dir_all(out)?;
    let config = verlc_runtime::model::builtin::config(&uri(model)?)?;
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    std::fs::write(
        out.join("tokenizer.json"),
        serde_json::to_string(&verlc_runtime::tokenizer::builtin::tokenizer_json())?,
    )?;
    std::fs::write(
        out.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&verlc_runtime::tokenizer::builtin::tokenizer_config_json())?,
    )?;
    let mut rows = std::fs::File::create(out.join("train.jsonl"))?;
    for row in verlc_runtime::data::builtin::rows(&uri(data)?)? {
        let truth = row
            .get("reward_model")
            .and_then(|r| r.get("ground_truth"))
            .cloned()
            .unwrap_or_default();
        let line = serde_json::json!({"prompt": row.get("prompt"), "ground_truth": truth});
        writeln!(rows, "{line}")?;
    }
    Ok(())
}
