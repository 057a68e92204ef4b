//! [`SftDataset`]: verl's multi-turn SFT data (`MultiTurnSFTDataset`, the `no_padding` mode its
//! engine trainer uses). Each row's `messages` column is a conversation; every message is
//! rendered through the chat template *alone* and the pieces are concatenated:
//! - a message after the first (other than a system message) loses as many leading tokens as
//!   the template's default system prompt has (a template such as Qwen's puts one in front of
//!   any lone message);
//! - an assistant message is trained on (`loss_mask` 1) except its first tokens, as many as the
//!   template's generation prompt has (`<|im_start|>assistant\n`); other messages are not;
//! - the `tools` column (when present) goes to the first message's rendering only, the
//!   `enable_thinking` column (else `data.enable_thinking_default`) and
//!   `data.apply_chat_template_kwargs` to every one;
//! - the concatenation must equal the whole conversation's rendering, else the row is refused
//!   (`data.ignore_input_ids_mismatch` trains on the concatenation);
//! - a conversation longer than `data.max_length` is refused under `truncation: error`, else its
//!   first `max_length` tokens are kept (`left` too: verl's no_padding mode cuts on the right).
//!
//! What changed between releases is in [`AlgoRelease`]'s `sft_*` methods.
//! Rows are tokenized when the dataset loads, so a bad row stops the run before training.

use serde_json::{Map, Value};

use crate::tokenizer::{Message, Tokenizer, TokenizerError};

use super::{DataError, RowProblems, files};

pub use verlc_spec::algo::AlgoRelease;
pub use verlc_spec::data::Truncation;
pub use verlc_spec::sft::{SftFormat, SftPadding};

/// The `data.*` settings of verl's SFT dataset.
#[derive(Debug, Clone)]
pub struct SftOptions {
    /// `data.messages_key`.
    pub messages_key: String,
    /// `data.tools_key`.
    pub tools_key: String,
    /// `data.enable_thinking_key`.
    pub enable_thinking_key: String,
    /// `data.enable_thinking_default`; `None` leaves the template's own default.
    pub enable_thinking_default: Option<bool>,
    /// `data.max_length`.
    pub max_length: usize,
    /// `data.truncation` (`middle` is not one of the SFT dataset's; the checker refuses it).
    pub truncation: Truncation,
    /// `data.ignore_input_ids_mismatch`.
    pub ignore_input_ids_mismatch: bool,
    /// `data.apply_chat_template_kwargs`.
    pub chat_template_kwargs: Map<String, Value>,
    /// Use at most this many rows; `None` (verl's -1) uses all.
    pub max_samples: Option<usize>,
    /// Pick the `max_samples` rows at random (seeded; not numpy's draw) instead of the first.
    pub shuffle: bool,
    pub seed: u64,
    /// The verl release whose dataset to reproduce.
    pub release: AlgoRelease,
    /// How a row becomes a conversation (`messages`, or a prompt and a response column).
    pub format: SftFormat,
    /// `pad_mode`: `right` refuses or cuts an overlong row as `truncation` says.
    pub padding: SftPadding,
}

impl Default for SftOptions {
    fn default() -> Self {
        SftOptions {
            messages_key: "messages".into(),
            tools_key: "tools".into(),
            enable_thinking_key: "enable_thinking".into(),
            enable_thinking_default: None,
            max_length: 1024,
            truncation: Truncation::Error,
            ignore_input_ids_mismatch: false,
            chat_template_kwargs: Map::new(),
            max_samples: None,
            shuffle: false,
            seed: 0,
            release: AlgoRelease::NEWEST,
            format: SftFormat::MultiTurn,
            padding: SftPadding::NoPadding,
        }
    }
}

/// One tokenized conversation; its position ids are `0..input_ids.len()`.
#[derive(Debug, Clone, PartialEq)]
pub struct SftExample {
    pub input_ids: Vec<i64>,
    /// Which tokens the loss is taken over (the assistant turns' replies).
    pub loss_mask: Vec<bool>,
    /// The file (or address) and row it came from.
    pub source: String,
    pub row: usize,
}

impl SftExample {
    /// Tokens the loss is taken over.
    pub fn loss_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|m| **m).count()
    }
}

/// The token runs verl measures once per dataset from the chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatPrompts {
    /// The default system prompt the template puts in front of a lone message.
    pub system: Vec<i64>,
    /// What `add_generation_prompt` appends (`<|im_start|>assistant\n`).
    pub generation: Vec<i64>,
}

impl ChatPrompts {
    /// verl's `extract_system_prompt_and_generation`: one empty user turn against two (the
    /// difference is one turn; the rest of the first is the system prompt), and against the same
    /// with the generation prompt.
    pub fn measure(tok: &Tokenizer, kwargs: &Map<String, Value>) -> Result<Self, TokenizerError> {
        let user = Message::user("");
        let one = tok.encode_chat(std::slice::from_ref(&user), false, kwargs)?;
        let two = tok.encode_chat(&[user.clone(), user.clone()], false, kwargs)?;
        let turn = two.len().saturating_sub(one.len());
        // Python's `one[:-turn]`: empty when the turn is empty (`-0` is 0) or longer than `one`.
        let system = if turn == 0 {
            Vec::new()
        } else {
            one[..one.len().saturating_sub(turn)].to_vec()
        };
        let with_prompt = tok.encode_chat(std::slice::from_ref(&user), true, kwargs)?;
        let generation = with_prompt.get(one.len()..).unwrap_or_default().to_vec();
        Ok(ChatPrompts { system, generation })
    }

    /// [`Self::measure`] with the template arguments the release measures with (none before
    /// 0.8.0).
    pub fn for_options(tok: &Tokenizer, opts: &SftOptions) -> Result<Self, TokenizerError> {
        if opts.release.sft_prompts_with_kwargs() {
            Self::measure(tok, &opts.chat_template_kwargs)
        } else {
            Self::measure(tok, &Map::new())
        }
    }
}

/// Why a conversation cannot be encoded.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(
        "the conversation is {len} tokens, longer than data.max_length = {max} (data.truncation \
         is error; `right` keeps its first {max} tokens)"
    )]
    TooLong { len: usize, max: usize },
    #[error(
        "the chat template renders this conversation differently as a whole than message by \
         message ({whole} tokens against {pieces}); verl's SFT dataset refuses it too. The \
         template makes a turn depend on its neighbours (consecutive tool messages, thinking \
         removed from earlier turns, ...): set data.ignore_input_ids_mismatch: true to train on \
         the message-by-message tokens"
    )]
    Mismatch { whole: usize, pieces: usize },
    #[error(
        "the tokenizer has no eos token (tokenizer_config.json `eos_token`) to end the response with"
    )]
    NoEosToken,
}

/// A conversation as tokens with what the encoding noticed.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedConversation {
    pub input_ids: Vec<i64>,
    pub loss_mask: Vec<bool>,
    /// The message-by-message tokens differ from the whole rendering (ignored by option).
    pub mismatched: bool,
    /// Assistant turns whose rendering does not start with the generation prompt: verl masks
    /// as many of their first tokens anyway, which may hide part of the reply.
    pub turns_without_prompt: usize,
}

/// Renders one message alone as verl does (`tokenize=True`); from 0.7.1 a message the template
/// refuses alone is rendered after an empty user turn whose tokens are then cut off.
fn render_alone(
    tok: &Tokenizer,
    message: &Message,
    kwargs: &Map<String, Value>,
    fallback: bool,
) -> Result<Vec<i64>, TokenizerError> {
    match tok.encode_chat(std::slice::from_ref(message), false, kwargs) {
        Ok(ids) => Ok(ids),
        Err(first) if fallback => {
            let mut dummy = Message::user("");
            dummy.content = serde_json::json!([{"type": "text", "text": ""}]);
            let prefix = tok
                .encode_chat(std::slice::from_ref(&dummy), false, kwargs)
                .map_err(|_| first)?;
            let both = tok.encode_chat(&[dummy, message.clone()], false, kwargs)?;
            Ok(both.get(prefix.len()..).unwrap_or_default().to_vec())
        }
        Err(e) => Err(e),
    }
}

/// Encodes one conversation (module docs). `tools` goes to the first message's rendering and
/// the whole one; `enable_thinking`, when set, joins the template arguments.
pub fn encode_conversation(
    tok: &Tokenizer,
    prompts: &ChatPrompts,
    opts: &SftOptions,
    messages: &[Message],
    tools: Option<&Value>,
    enable_thinking: Option<bool>,
) -> Result<EncodedConversation, ConversationError> {
    let mut kwargs = opts.chat_template_kwargs.clone();
    if let Some(on) = enable_thinking {
        kwargs.insert("enable_thinking".into(), Value::Bool(on));
    }
    let mut with_tools = kwargs.clone();
    if let Some(t) = tools {
        with_tools.insert("tools".into(), t.clone());
    }
    let fallback = opts.release.sft_lone_message_fallback();
    let mut input_ids = Vec::new();
    let mut loss_mask = Vec::new();
    let mut turns_without_prompt = 0;
    for (i, message) in messages.iter().enumerate() {
        let args = if i == 0 { &with_tools } else { &kwargs };
        let mut ids = render_alone(tok, message, args, fallback)?;
        if i != 0 && message.role != "system" {
            ids.drain(..prompts.system.len().min(ids.len()));
        }
        if message.role == "assistant" {
            if !ids.starts_with(&prompts.generation) {
                turns_without_prompt += 1;
            }
            let masked = prompts.generation.len().min(ids.len());
            loss_mask.extend((0..ids.len()).map(|j| j >= masked));
        } else {
            loss_mask.extend(std::iter::repeat_n(false, ids.len()));
        }
        input_ids.extend(ids);
    }
    let whole = tok.encode_chat(messages, false, &with_tools)?;
    let mismatched = whole != input_ids;
    if mismatched && !opts.ignore_input_ids_mismatch {
        return Err(ConversationError::Mismatch {
            whole: whole.len(),
            pieces: input_ids.len(),
        });
    }
    fit_length(opts, &mut input_ids, &mut loss_mask)?;
    Ok(EncodedConversation {
        input_ids,
        loss_mask,
        mismatched,
        turns_without_prompt,
    })
}

/// Cuts an overlong row to `max_length` as the dataset's padding mode does: without padding the
/// first tokens are kept (refused under `truncation: error` from 0.7.1); padded on the right,
/// `truncation` is obeyed (refused, or the last or first tokens kept).
pub(super) fn fit_length<T>(
    opts: &SftOptions,
    input_ids: &mut Vec<i64>,
    per_token: &mut Vec<T>,
) -> Result<(), ConversationError> {
    let (len, max) = (input_ids.len(), opts.max_length);
    if len <= max {
        return Ok(());
    }
    let refuse = match opts.padding {
        SftPadding::NoPadding => {
            opts.truncation == Truncation::Error && opts.release.sft_overlong_is_error()
        }
        SftPadding::Right => opts.truncation == Truncation::Error,
    };
    if refuse {
        return Err(ConversationError::TooLong { len, max });
    }
    if opts.padding == SftPadding::Right && opts.truncation == Truncation::Left {
        input_ids.drain(..len - max);
        per_token.drain(..len - max);
    } else {
        input_ids.truncate(max);
        per_token.truncate(max);
    }
    Ok(())
}

/// Every row of the SFT files, tokenized.
#[derive(Debug, Clone)]
pub struct SftDataset {
    pub examples: Vec<SftExample>,
    pub prompts: ChatPrompts,
    /// Rows trained on their message-by-message tokens (`ignore_input_ids_mismatch`).
    pub mismatched: usize,
    /// Assistant turns whose first tokens verl masks although they are not the generation
    /// prompt (e.g. `enable_thinking: false` in the template arguments adds an empty think
    /// block to the generation prompt that a lone assistant message does not render).
    pub turns_without_prompt: usize,
}

impl SftDataset {
    /// Reads, concatenates and tokenizes every file of `files` in order.
    pub fn load(files: &[String], tok: &Tokenizer, opts: &SftOptions) -> Result<Self, DataError> {
        let rows = files::read_sampled(files, opts.max_samples, opts.shuffle, opts.seed)?;
        let prompts = ChatPrompts::for_options(tok, opts).map_err(DataError::ChatPrompts)?;
        let mut out = SftDataset {
            examples: Vec::with_capacity(rows.len()),
            prompts,
            mismatched: 0,
            turns_without_prompt: 0,
        };
        // Every row is encoded and every bad one counted (RowProblems), as for RL data.
        let mut problems = RowProblems::default();
        for (source, row, map) in rows {
            let bad = |msg: String| DataError::Row {
                file: source.clone(),
                row,
                msg,
            };
            let encoded = match &opts.format {
                SftFormat::MultiTurn => Conversation::from_row(map, opts).and_then(|conv| {
                    conv.encode(tok, &out.prompts, opts)
                        .map_err(|e| e.to_string())
                }),
                SftFormat::SingleTurn(keys) => {
                    super::sft_single_turn::PromptResponse::from_row(&map, keys)
                        .and_then(|pr| pr.encode(tok, opts).map_err(|e| e.to_string()))
                }
            };
            let enc = match encoded {
                Ok(enc) => enc,
                Err(msg) => {
                    problems.push(bad(msg));
                    continue;
                }
            };
            out.mismatched += usize::from(enc.mismatched);
            out.turns_without_prompt += enc.turns_without_prompt;
            out.examples.push(SftExample {
                input_ids: enc.input_ids,
                loss_mask: enc.loss_mask,
                source,
                row,
            });
        }
        problems.into_result()?;
        if out.examples.is_empty() {
            return Err(DataError::Empty(String::new()));
        }
        Ok(out)
    }

    /// What the encoding noticed that a user should hear before training on `key`'s files
    /// (verl trains the same way, silently).
    pub fn warnings(&self, key: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.turns_without_prompt > 0 {
            out.push(format!(
                "{key}: {} assistant turn(s) do not start with the chat template's generation prompt \
                 (template arguments such as `enable_thinking: false` add to that prompt what a lone \
                 assistant message does not render); verl masks as many of their first tokens as the \
                 prompt has, so the start of those replies is not trained on, here as in verl",
                self.turns_without_prompt
            ));
        }
        if self.mismatched > 0 {
            out.push(format!(
                "{key}: {} conversation(s) tokenize differently message by message than as a whole; \
                 they train on the message-by-message tokens (data.ignore_input_ids_mismatch=true)",
                self.mismatched
            ));
        }
        out
    }

    pub fn len(&self) -> usize {
        self.examples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }
}

/// One row of an SFT file: its conversation and what the template gets with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    /// The `tools` column (`data.tools_key`), when present and not null.
    pub tools: Option<Value>,
    /// The `enable_thinking` column, else `data.enable_thinking_default`.
    pub enable_thinking: Option<bool>,
}

impl Conversation {
    /// Reads a row; errors are messages for [`DataError::Row`].
    pub fn from_row(mut row: Map<String, Value>, opts: &SftOptions) -> Result<Self, String> {
        let messages = row_messages(&row, &opts.messages_key)?;
        let tools = row.remove(&opts.tools_key).filter(|v| !v.is_null());
        let enable_thinking = match row.get(&opts.enable_thinking_key) {
            None | Some(Value::Null) => opts.enable_thinking_default,
            Some(Value::Bool(b)) => Some(*b),
            Some(Value::Number(n)) => Some(n.as_f64().is_some_and(|x| x != 0.0)),
            Some(other) => {
                return Err(format!(
                    "column `{}` must be a boolean, got {other}",
                    opts.enable_thinking_key
                ));
            }
        };
        Ok(Conversation {
            messages,
            tools,
            enable_thinking,
        })
    }

    /// [`encode_conversation`] of this row.
    pub fn encode(
        &self,
        tok: &Tokenizer,
        prompts: &ChatPrompts,
        opts: &SftOptions,
    ) -> Result<EncodedConversation, ConversationError> {
        encode_conversation(
            tok,
            prompts,
            opts,
            &self.messages,
            self.tools.as_ref(),
            self.enable_thinking,
        )
    }
}

/// The conversation in column `key`: a list of `{role, content, ...}` messages.
fn row_messages(row: &Map<String, Value>, key: &str) -> Result<Vec<Message>, String> {
    match row.get(key) {
        Some(v @ Value::Array(items)) => {
            if items.is_empty() {
                return Err(format!("column `{key}` is an empty conversation"));
            }
            serde_json::from_value(v.clone()).map_err(|e| {
                format!("column `{key}` is not a list of {{role, content}} messages: {e}")
            })
        }
        Some(other) => Err(format!(
            "column `{key}` must be a list of chat messages (data.messages_key), got {other}"
        )),
        None => Err(format!("no column `{key}` (data.messages_key)")),
    }
}
