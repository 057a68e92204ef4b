//! The token ids generation needs from `generation_config.json` (falling back to
//! `config.json`, as transformers' `GenerationConfig.from_pretrained` does): EOS (one id or
//! a list), pad and BOS.

use std::path::Path;

use serde_json::Value;

use super::TokenizerError;

/// Stop and padding ids for generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<i64>,
    pub pad_token_id: Option<i64>,
    pub bos_token_id: Option<i64>,
}

fn ids(v: Option<&Value>) -> Vec<i64> {
    match v {
        Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_i64).collect(),
        _ => Vec::new(),
    }
}

impl GenerationConfig {
    pub fn from_json(v: &Value) -> Self {
        GenerationConfig {
            eos_token_ids: ids(v.get("eos_token_id")),
            pad_token_id: v.get("pad_token_id").and_then(Value::as_i64),
            bos_token_id: v.get("bos_token_id").and_then(Value::as_i64),
        }
    }

    /// Writes `generation_config.json` (e.g. next to a saved checkpoint, so transformers'
    /// `generate()` stops where ours does).
    pub fn save(&self, dir: &Path) -> Result<(), TokenizerError> {
        let eos = match self.eos_token_ids.as_slice() {
            [one] => serde_json::json!(one),
            many => serde_json::json!(many),
        };
        let v = serde_json::json!({
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
            "bos_token_id": self.bos_token_id,
        });
        let path = dir.join("generation_config.json");
        let text = serde_json::to_string_pretty(&v).map_err(|e| TokenizerError::Config {
            file: path.clone(),
            msg: e.to_string(),
        })?;
        std::fs::write(&path, text + "\n").map_err(|e| TokenizerError::io(&path, e))
    }

    /// `generation_config.json` of `dir`, else the token ids of its `config.json`, else empty.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        for name in ["generation_config.json", "config.json"] {
            let path = dir.join(name);
            if path.is_file() {
                let text =
                    std::fs::read_to_string(&path).map_err(|e| TokenizerError::io(&path, e))?;
                let v: Value = serde_json::from_str(&text).map_err(|e| TokenizerError::Config {
                    file: path.clone(),
                    msg: e.to_string(),
                })?;
                return Ok(Self::from_json(&v));
            }
        }
        Ok(GenerationConfig::default())
    }
}
