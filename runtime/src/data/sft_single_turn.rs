//! verl 0.7.0's single-turn SFT data (`SFTDataset`, read by the legacy `fsdp_sft_trainer` when
//! `data.multiturn.enable` is false): a prompt column and a response column.
//!
//! - The prompt is the cell of `data.prompt_key`, then its value at each of
//!   `data.prompt_dict_keys` in turn (gsm8k's `extra_info.question`); a one-element list around
//!   a cell is looked through, as verl's `series_to_item` does. The response likewise.
//! - The prompt is rendered as one user message with the generation prompt; the response is
//!   the text followed by the tokenizer's eos token; each is tokenized alone, without special
//!   tokens, and the two are concatenated.
//! - The row is padded on the right to `max_length` (the padding never reaches the loss and is
//!   not stored); an overlong row is refused, or cut on the side `data.truncation` names.
//! - The loss mask is verl's, quirks included: every token from the prompt's *last* token on is
//!   a target (verl zeroes `loss_mask[:prompt_len - 1]`), except the row's last token (the eos,
//!   or the last kept one). The positions are those of the kept tokens, so a left-cut row
//!   masks its first `prompt_len - 1` kept tokens, whatever they are.

use serde_json::{Map, Value};

use crate::tokenizer::{Message, Tokenizer};
use verlc_spec::sft::SingleTurnKeys;

use super::sft::{ConversationError, EncodedConversation, SftOptions, fit_length};

/// One single-turn row's texts.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptResponse {
    pub prompt: String,
    pub response: String,
}

impl PromptResponse {
    /// Reads a row; errors are messages for [`super::DataError::Row`].
    pub fn from_row(row: &Map<String, Value>, keys: &SingleTurnKeys) -> Result<Self, String> {
        let prompt = cell(row, &keys.prompt_key, &keys.prompt_dict_keys, "prompt")?;
        let response = cell(
            row,
            &keys.response_key,
            &keys.response_dict_keys,
            "response",
        )?;
        Ok(PromptResponse { prompt, response })
    }

    /// The row's tokens and loss mask (module docs).
    pub fn encode(
        &self,
        tok: &Tokenizer,
        opts: &SftOptions,
    ) -> Result<EncodedConversation, ConversationError> {
        let prompt_ids = tok.encode_chat(
            &[Message::user(self.prompt.as_str())],
            true,
            &opts.chat_template_kwargs,
        )?;
        let eos = tok
            .special_token("eos_token")
            .ok_or(ConversationError::NoEosToken)?;
        let response_ids = tok.encode(&format!("{}{eos}", self.response), false)?;
        let (prompt_len, whole) = (prompt_ids.len(), prompt_ids.len() + response_ids.len());
        let mut input_ids = prompt_ids;
        input_ids.extend(response_ids);
        let mut unused = vec![(); whole];
        fit_length(opts, &mut input_ids, &mut unused)?;
        let kept = input_ids.len();
        let mut loss_mask = vec![true; kept];
        if prompt_len > 1 {
            for m in loss_mask.iter_mut().take(prompt_len.min(kept) - 1) {
                *m = false;
            }
        }
        if let Some(last) = loss_mask.last_mut() {
            *last = false;
        }
        Ok(EncodedConversation {
            input_ids,
            loss_mask,
            mismatched: false,
            turns_without_prompt: 0,
        })
    }
}

/// The text of `key`'s cell at `dict_keys`.
fn cell(
    row: &Map<String, Value>,
    key: &str,
    dict_keys: &[String],
    what: &str,
) -> Result<String, String> {
    let mut value = row
        .get(key)
        .ok_or_else(|| format!("no column `{key}` (data.{what}_key)"))?;
    let mut path = key.to_owned();
    for k in dict_keys {
        value = look_through(value)
            .as_object()
            .and_then(|m| m.get(k))
            .ok_or_else(|| {
                format!(
                    "`{path}` has no key `{k}` (data.{what}_dict_keys); it is {}",
                    brief(value)
                )
            })?;
        path = format!("{path}.{k}");
    }
    match look_through(value) {
        Value::String(s) => Ok(s.clone()),
        other => Err(format!(
            "the {what} (`{path}`) must be text, got {}",
            brief(other)
        )),
    }
}

/// The value inside one-element lists (pandas cells verl unwraps).
fn look_through(mut v: &Value) -> &Value {
    while let Value::Array(items) = v {
        match items.as_slice() {
            [only] => v = only,
            _ => break,
        }
    }
    v
}

fn brief(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}
