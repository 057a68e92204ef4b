//! A discriminative reward model (`reward_model.enable`): a one-label classifier scored at the
//! last token of the conversation, as verl 0.7.0's reward-model worker and reward loop score.
//!
//! What reaches the model ([`RewardModelInput`]):
//! - `PolicyTokens`: the policy's own prompt and response tokens (the legacy worker with
//!   `model.input_tokenizer: null`);
//! - `Chat`: the prompt's messages plus the response, decoded by the policy's tokenizer with
//!   its EOS text removed, as the assistant's turn, rendered by the reward model's own chat
//!   template and encoded by its own tokenizer. The legacy worker encodes the text without
//!   special tokens and cuts it to `max_length`; the reward loop (a vLLM `classify` request)
//!   cuts a leading BOS text and lets the tokenizer add its special tokens.
//!
//! Rows are left-padded into micro-batches so that every row's last token is the batch's last
//! column: the last decoder layer then runs for that one position
//! ([`crate::model::decoder::Model::forward_window`]), the same value as taking each row's last
//! valid position of a right-padded batch (verl's `argmax(position_ids * attention_mask)`).

use serde_json::Map;
use tch::{Device, Kind, Tensor};
use verlc_spec::trainer::{RewardModelInput, RewardModelSpec};

use crate::data::dataset::truncate;
use crate::model::{
    Dtype, LoadedModel, ValueModel, position_ids_from_mask, reward_from_pretrained,
};
use crate::tokenizer::{Message, Tokenizer};

use super::RewardError;

/// One response to score: the prompt it answers and the policy's tokens.
#[derive(Debug, Clone, Copy)]
pub struct RewardInput<'a> {
    /// The prompt's chat messages (verl's `raw_prompt`).
    pub messages: &'a [Message],
    /// The prompt's tokens, without padding.
    pub prompt_ids: &'a [i64],
    /// The response's tokens up to and including its EOS, without padding.
    pub response_ids: &'a [i64],
}

/// A loaded reward model.
#[derive(Debug)]
pub struct RewardModel {
    model: LoadedModel<ValueModel>,
    /// The reward model's tokenizer (`Chat` input only).
    tokenizer: Option<Tokenizer>,
    input: RewardModelInput,
    micro_batch: usize,
    pad_id: i64,
}

fn other(msg: impl Into<String>) -> RewardError {
    RewardError::Other(msg.into())
}

impl RewardModel {
    /// Loads the model of `spec` (and its tokenizer when it reads chats) in `precision`.
    pub fn load(
        spec: &RewardModelSpec,
        precision: Dtype,
        device: Device,
    ) -> Result<Self, RewardError> {
        if spec.micro_batch == 0 {
            return Err(other("reward model micro-batch size must be positive"));
        }
        let model = reward_from_pretrained(&spec.model_path, device, precision, spec.seed)
            .map_err(|e| other(format!("reward model: {e}")))?;
        let tokenizer = match spec.input {
            RewardModelInput::PolicyTokens => None,
            RewardModelInput::Chat { .. } => {
                let t = Tokenizer::from_pretrained(&spec.model_path)
                    .map_err(|e| other(format!("reward model tokenizer: {e}")))?;
                if !t.has_chat_template() {
                    return Err(other(format!(
                        "reward model `{}`: its tokenizer has no chat template, which verl applies to every response",
                        spec.model_path
                    )));
                }
                Some(t)
            }
        };
        let pad_id = tokenizer.as_ref().map_or(0, |t| t.pad_token_id);
        Ok(RewardModel {
            model,
            tokenizer,
            input: spec.input.clone(),
            micro_batch: spec.micro_batch,
            pad_id,
        })
    }

    /// The score of each response; `policy` is the tokenizer that produced the responses.
    pub fn score(
        &self,
        policy: &Tokenizer,
        rows: &[RewardInput<'_>],
    ) -> Result<Vec<f64>, RewardError> {
        let ids = match &self.input {
            RewardModelInput::PolicyTokens => rows
                .iter()
                .map(|r| [r.prompt_ids, r.response_ids].concat())
                .collect(),
            RewardModelInput::Chat { .. } => {
                let eos = policy.special_token("eos_token").unwrap_or_default();
                let chats = rows
                    .iter()
                    .map(|r| {
                        let mut text = policy.decode(r.response_ids, false)?;
                        if !eos.is_empty() {
                            text = text.replace(eos, "");
                        }
                        let mut chat = r.messages.to_vec();
                        chat.push(Message::assistant(&text));
                        Ok(chat)
                    })
                    .collect::<Result<Vec<_>, crate::tokenizer::TokenizerError>>()
                    .map_err(|e| other(format!("decoding a response: {e}")))?;
                self.encode_chats(&chats)?
            }
        };
        self.score_ids(&ids)
    }

    /// The reward model's tokens of conversations that end with the assistant's response.
    pub fn encode_chats(&self, chats: &[Vec<Message>]) -> Result<Vec<Vec<i64>>, RewardError> {
        let (
            Some(tok),
            RewardModelInput::Chat {
                add_special_tokens,
                max_length,
                truncation,
            },
        ) = (&self.tokenizer, &self.input)
        else {
            return Err(other(
                "this reward model reads the policy's tokens, not conversations",
            ));
        };
        let bos = tok.special_token("bos_token").unwrap_or_default();
        chats
            .iter()
            .map(|chat| {
                let text = tok
                    .apply_chat_template(chat, false, &Map::new())
                    .map_err(|e| other(format!("reward model chat template: {e}")))?;
                let text = match (*add_special_tokens, text.strip_prefix(bos)) {
                    (true, Some(rest)) if !bos.is_empty() => rest,
                    _ => text.as_str(),
                };
                let ids = tok
                    .encode(text, *add_special_tokens)
                    .map_err(|e| other(format!("reward model tokenizer: {e}")))?;
                match max_length {
                    None => Ok(ids),
                    Some(max) => truncate(&ids, *max, *truncation).ok_or_else(|| {
                        other(format!(
                            "a reward-model input has {} tokens, more than reward_model.max_length = {max} (truncation: error)",
                            ids.len()
                        ))
                    }),
                }
            })
            .collect()
    }

    /// The score at the last token of each row of tokens, in f64.
    pub fn score_ids(&self, rows: &[Vec<i64>]) -> Result<Vec<f64>, RewardError> {
        let mut out = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(self.micro_batch) {
            out.extend(self.score_micro_batch(chunk)?);
        }
        Ok(out)
    }

    fn score_micro_batch(&self, rows: &[Vec<i64>]) -> Result<Vec<f64>, RewardError> {
        let width = rows.iter().map(Vec::len).max().unwrap_or(0);
        if rows.iter().any(Vec::is_empty) {
            return Err(other("a reward-model input has no tokens"));
        }
        let vocab = self.model.config.vocab_size;
        let mut ids = vec![self.pad_id; rows.len() * width];
        let mut mask = vec![0i64; rows.len() * width];
        for (i, row) in rows.iter().enumerate() {
            if let Some(&bad) = row.iter().find(|&&t| t < 0 || t >= vocab) {
                return Err(other(format!(
                    "token id {bad} is outside the reward model's vocabulary of {vocab}: the reward model needs its own tokenizer (reward_model.model.input_tokenizer)"
                )));
            }
            let start = i * width + width - row.len();
            ids[start..start + row.len()].copy_from_slice(row);
            mask[start..start + row.len()].fill(1);
        }
        let device = self.model.model.model.embed_tokens.device();
        let shape = [rows.len() as i64, width as i64];
        let ids = Tensor::from_slice(&ids)
            .f_view(shape)?
            .f_to_device(device)?;
        let mask = Tensor::from_slice(&mask)
            .f_view(shape)?
            .f_to_device(device)?;
        let pos = position_ids_from_mask(&mask);
        let scores = tch::no_grad(|| {
            let hidden =
                self.model
                    .model
                    .model
                    .forward_window(&ids, &pos, &mask, width as i64 - 1, 1);
            self.model
                .model
                .score()
                .forward(&hidden)
                .view([-1])
                .to_kind(Kind::Double)
                .to_device(Device::Cpu)
        });
        Ok(Vec::<f64>::try_from(&scores)?)
    }
}
