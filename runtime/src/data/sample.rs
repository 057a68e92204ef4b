//! One RL sample in verl's layout (`verl/utils/dataset/rl_dataset.py`): the chat prompt, the
//! reward selector `data_source`, `reward_model = {style, ground_truth}`, `ability`,
//! `extra_info` (its `index` becomes the sample index) and every column as read.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::tokenizer::Message;

/// `reward_model` column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardSpec {
    /// `rule` or `model`.
    pub style: Option<String>,
    pub ground_truth: Value,
}

/// A dataset row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub prompt: Vec<Message>,
    pub data_source: String,
    pub ability: Option<String>,
    pub reward_model: RewardSpec,
    pub extra_info: Map<String, Value>,
    /// `extra_info.index` when it is an integer, else the row number.
    pub index: i64,
    /// Every column of the row (including the ones above), for custom reward functions.
    pub row: Map<String, Value>,
}

impl Sample {
    /// Reads a row; `prompt_key` and `reward_fn_key` are `data.prompt_key` /
    /// `data.reward_fn_key`. Errors are messages for [`super::DataError::Row`].
    pub fn from_row(
        row: Map<String, Value>,
        prompt_key: &str,
        reward_fn_key: &str,
        row_no: usize,
    ) -> Result<Self, String> {
        let prompt: Vec<Message> = match row.get(prompt_key) {
            // verl passes the column to the chat template as the conversation: a string is
            // rendered character by character, a prompt no one meant to train on.
            Some(Value::String(_)) => {
                return Err(format!(
                    "column `{prompt_key}` is a string; verl reads it as the list of chat messages \
                     (`[{{\"role\": \"user\", \"content\": ...}}]`, as verl's examples/data_preprocess \
                     scripts write it) and would render a string one character per message"
                ));
            }
            Some(v @ Value::Array(_)) => serde_json::from_value(v.clone()).map_err(|e| {
                format!("column `{prompt_key}` is not a list of {{role, content}} messages: {e}")
            })?,
            Some(other) => {
                return Err(format!(
                    "column `{prompt_key}` must be a list of chat messages, got {other}"
                ));
            }
            None => return Err(format!("no column `{prompt_key}` (data.prompt_key)")),
        };
        if prompt.is_empty() {
            return Err(format!("column `{prompt_key}` is an empty conversation"));
        }
        let data_source = match row.get(reward_fn_key) {
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(format!(
                    "column `{reward_fn_key}` must be a string, got {other}"
                ));
            }
            None => return Err(format!("no column `{reward_fn_key}` (data.reward_fn_key)")),
        };
        let reward_model = match row.get("reward_model") {
            Some(Value::Object(m)) => RewardSpec {
                style: m.get("style").and_then(Value::as_str).map(str::to_owned),
                ground_truth: m.get("ground_truth").cloned().unwrap_or(Value::Null),
            },
            None | Some(Value::Null) => RewardSpec {
                style: None,
                ground_truth: Value::Null,
            },
            Some(other) => {
                return Err(format!(
                    "column `reward_model` must be a struct, got {other}"
                ));
            }
        };
        let extra_info = match row.get("extra_info") {
            Some(Value::Object(m)) => m.clone(),
            None | Some(Value::Null) => Map::new(),
            Some(other) => {
                return Err(format!("column `extra_info` must be a struct, got {other}"));
            }
        };
        let index = extra_info
            .get("index")
            .and_then(Value::as_i64)
            .unwrap_or(row_no as i64);
        let ability = row
            .get("ability")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(Sample {
            prompt,
            data_source,
            ability,
            reward_model,
            extra_info,
            index,
            row,
        })
    }

    /// The ground truth as text (strings as they are, other JSON values serialized).
    pub fn ground_truth_str(&self) -> String {
        match &self.reward_model.ground_truth {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
}
