//! The tokens a tool round adds to a trajectory, as verl 0.9's "continuous token" builder makes
//! them: the token stream is never re-tokenised; a round's tool messages are rendered after a
//! fixed synthetic conversation (a system, a user and an assistant turn that called one tool
//! per message), and the tokens past that conversation's own rendering are appended. On
//! ChatML models (Qwen2/2.5/3/3.5) a turn the model ended at `<|im_end|>` first gets the `\n`
//! the template writes after it; those inserted tokens, like the tool tokens, are not the
//! model's (mask 0).

use serde_json::{Map, Value, json};

use crate::data::vision_prompt::{VideoSpans, encode_visual_prompt};
use crate::model::vision::ProcessedImage;
use crate::tokenizer::chat::Message;
use crate::tokenizer::{Tokenizer, TokenizerError};

const SYNTHETIC_SYSTEM: &str = "continuous token synthetic system";
const SYNTHETIC_USER: &str = "continuous token synthetic user";
const SYNTHETIC_TOOL: &str = "continuous_token_tool";
const SYNTHETIC_ASSISTANT: &str = "continuous token synthetic assistant";

/// How turns join: verl's builder of the model type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Junction {
    /// Appended as rendered.
    Plain,
    /// ChatML: `\n` after a generated `<|im_end|>`.
    ChatMl { im_end: i64, newline: i64 },
}

/// Errors of building a trajectory's tokens.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("{0}")]
    Tokenizer(#[from] TokenizerError),
    #[error(
        "the chat template renders the tool messages so that the conversation before them changes (roles {roles:?}); verl's token builder refuses this template too"
    )]
    NotAppendOnly { roles: Vec<String> },
    #[error("{0}")]
    Template(String),
}

/// Builds a trajectory's tokens with the policy's tokenizer and chat template.
pub struct ContextTokens<'a> {
    tokenizer: &'a Tokenizer,
    junction: Junction,
    /// `data.apply_chat_template_kwargs`, plus `tools` when the loop offers tools.
    kwargs: Map<String, Value>,
    /// A vision-language policy's spatial merge size (vision tokens per image: its patches
    /// over merge²) and how its prompts hold videos; `None` for a text model.
    vision: Option<(usize, VideoSpans)>,
}

/// The tokens a tool round (or a user turn) adds: `inserted` (the junction's) then `tools`
/// (the rendered messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextDelta {
    pub inserted: Vec<i64>,
    pub tools: Vec<i64>,
}

impl<'a> ContextTokens<'a> {
    /// The builder for `model_type` (the policy's `config.json`), offering `tools` (OpenAI
    /// function schemas) to the template.
    pub fn new(
        tokenizer: &'a Tokenizer,
        model_type: &str,
        tools: &[Value],
        chat_kwargs: &Map<String, Value>,
    ) -> Result<Self, ContextError> {
        let chatml = verlc_spec::families::of_checkpoint(model_type).is_some_and(|f| f.chatml);
        let junction = if chatml {
            let newline = tokenizer.encode("\n", false)?;
            let im_end = tokenizer.token_to_id("<|im_end|>");
            match (newline.as_slice(), im_end) {
                (&[nl], Some(end)) => Junction::ChatMl {
                    im_end: end,
                    newline: nl,
                },
                _ => {
                    return Err(ContextError::Template(format!(
                        "a {model_type} tokenizer needs `<|im_end|>` and a one-token \"\\n\""
                    )));
                }
            }
        } else {
            Junction::Plain
        };
        let mut kwargs = chat_kwargs.clone();
        if !tools.is_empty() {
            kwargs.insert("tools".into(), Value::Array(tools.to_vec()));
        }
        Ok(ContextTokens {
            tokenizer,
            junction,
            kwargs,
            vision: None,
        })
    }

    /// The builder for a vision-language policy whose tower merges `merge_size`² patches into
    /// one vision token, its prompts holding videos as `spans` says.
    pub fn with_vision(self, merge_size: usize, spans: VideoSpans) -> Self {
        ContextTokens {
            vision: Some((merge_size, spans)),
            ..self
        }
    }

    /// The prompt: the conversation with the generation prompt (and the tools).
    pub fn initial(&self, messages: &[Message]) -> Result<Vec<i64>, ContextError> {
        Ok(self.tokenizer.encode_chat(messages, true, &self.kwargs)?)
    }

    /// [`ContextTokens::initial`] of a conversation with images and videos (`visuals`, in the
    /// order the conversation holds them, as the data pipeline keeps a row's): each `<image>`
    /// and `<video>` placeholder becomes its item's vision tokens, as the data pipeline
    /// encodes a single-turn prompt.
    pub fn initial_with_images(
        &self,
        messages: &[Message],
        visuals: &[ProcessedImage],
    ) -> Result<Vec<i64>, ContextError> {
        if visuals.is_empty() {
            return self.initial(messages);
        }
        let vision = self.vision.ok_or_else(|| {
            ContextError::Template("a prompt with images needs a vision-language policy".into())
        })?;
        let (videos, images): (Vec<ProcessedImage>, Vec<ProcessedImage>) = visuals
            .iter()
            .cloned()
            .partition(|v| v.seconds_per_grid.is_some());
        let (ids, order) = encode_visual_prompt(
            self.tokenizer,
            messages,
            (&images, &videos),
            vision,
            &self.kwargs,
        )
        .map_err(|e| ContextError::Template(e.to_string()))?;
        // The turns are generated with the row's items in its order: the prompt must hold them
        // so.
        if order != visuals {
            return Err(ContextError::Template(
                "the conversation holds its images and videos in another order than the row's"
                    .into(),
            ));
        }
        Ok(ids)
    }

    /// The tokens `tool_messages` (one round's responses, in call order) add after a stream
    /// whose last token is `last`, ending with the next turn's generation prompt.
    pub fn tool_round(
        &self,
        last: Option<i64>,
        tool_messages: &[Message],
    ) -> Result<ContextDelta, ContextError> {
        let calls: Vec<Value> = tool_messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let id = m
                    .extra
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("continuous_token_call_{i}"), str::to_owned);
                let name = m
                    .extra
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or(SYNTHETIC_TOOL);
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": {}}})
            })
            .collect();
        let mut assistant = Message::assistant("");
        assistant
            .extra
            .insert("reasoning_content".into(), json!("reasoning"));
        assistant
            .extra
            .insert("tool_calls".into(), Value::Array(calls));
        let prefix = vec![
            Message::system(SYNTHETIC_SYSTEM),
            Message::user(SYNTHETIC_USER),
            assistant,
        ];
        self.after(last, prefix, tool_messages)
    }

    /// The tokens an interaction's `user` message adds after a stream whose last token is
    /// `last`, ending with the next turn's generation prompt (verl 0.7 renders it alone,
    /// without the system prompt; after a synthetic exchange here, which is the same on
    /// templates whose turns render independently).
    pub fn user_turn(
        &self,
        last: Option<i64>,
        user: &Message,
    ) -> Result<ContextDelta, ContextError> {
        let prefix = vec![
            Message::system(SYNTHETIC_SYSTEM),
            Message::user(SYNTHETIC_USER),
            Message::assistant(SYNTHETIC_ASSISTANT),
        ];
        self.after(last, prefix, std::slice::from_ref(user))
    }

    /// The tokens `messages` add after `prefix` (rendered with the generation prompt), with the
    /// junction after `last`.
    fn after(
        &self,
        last: Option<i64>,
        prefix: Vec<Message>,
        messages: &[Message],
    ) -> Result<ContextDelta, ContextError> {
        let before = self.tokenizer.encode_chat(&prefix, false, &self.kwargs)?;
        let mut all = prefix;
        all.extend_from_slice(messages);
        let after = self.tokenizer.encode_chat(&all, true, &self.kwargs)?;
        if after.get(..before.len()) != Some(before.as_slice()) {
            return Err(ContextError::NotAppendOnly {
                roles: messages.iter().map(|m| m.role.clone()).collect(),
            });
        }
        let inserted = match self.junction {
            Junction::ChatMl { im_end, newline } if last == Some(im_end) => vec![newline],
            _ => Vec::new(),
        };
        Ok(ContextDelta {
            inserted,
            tools: after[before.len()..].to_vec(),
        })
    }
}
