//! Tokenizers of Hugging Face checkpoints: `tokenizer.json` through the `tokenizers` crate
//! (pure Rust, fancy-regex), the chat template of `tokenizer_config.json` (or
//! `chat_template.jinja`) through minijinja ([`chat`]), and EOS/pad ids from
//! `generation_config.json` ([`generation`]). `builtin://tiny` has its own ([`builtin`]).

pub mod builtin;
pub mod chat;
pub mod generation;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::builtin_uri::BuiltinUri;

pub use chat::{ChatTemplate, Message};
pub use generation::GenerationConfig;

/// Errors of tokenizer loading, encoding and chat templating.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {msg}", file.display())]
    Config { file: PathBuf, msg: String },
    #[error("{}: no tokenizer.json (only fast tokenizers are supported)", dir.display())]
    NoTokenizer { dir: PathBuf },
    #[error("tokenizer `{path}`: {msg}")]
    Source { path: String, msg: String },
    #[error(
        "tokenizer has no chat template (tokenizer_config.json `chat_template` or chat_template.jinja)"
    )]
    NoChatTemplate,
    #[error("chat template: {0:#}")]
    Template(#[from] minijinja::Error),
    #[error("tokenizer: {0}")]
    Tokenizers(String),
    #[error("token id {id} is outside the vocabulary ({size} tokens)")]
    BadId { id: i64, size: usize },
}

impl TokenizerError {
    pub(crate) fn io(file: &Path, source: std::io::Error) -> Self {
        TokenizerError::Io {
            file: file.to_owned(),
            source,
        }
    }
}

/// A tokenizer with its chat template and special ids.
#[derive(Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat: Option<ChatTemplate>,
    /// Special-token strings passed to the chat template (`bos_token`, `eos_token` …).
    special: Map<String, Value>,
    /// Ids that end generation: generation_config's EOS ids, then the tokenizer's EOS.
    pub eos_token_ids: Vec<i64>,
    /// Padding id: the tokenizer's pad token, else generation_config's, else the first EOS.
    pub pad_token_id: i64,
    /// The generation ids as read (generation_config.json or config.json, or built in).
    pub generation: GenerationConfig,
    config_json: Value,
    chat_source: Option<String>,
}

/// A special token in tokenizer_config.json: a string or an AddedToken dict.
fn token_str(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

/// The default chat template of tokenizer_config.json (a string, or a list of named ones).
fn default_template(cfg: &Value) -> Option<String> {
    match cfg.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

impl Tokenizer {
    /// A checkpoint directory, a Hub id in the Hub cache, `builtin://tiny`, or a scaled
    /// stand-in model (`builtin://scaled?from=...`: its source's tokenizer).
    pub fn from_pretrained(path: &str) -> Result<Self, TokenizerError> {
        match BuiltinUri::parse(path) {
            Some(uri) => {
                let source = |msg: String| TokenizerError::Source {
                    path: path.into(),
                    msg,
                };
                let uri = uri.map_err(source)?;
                let param = |key: &str| uri.get(key, String::new()).map_err(source);
                // A scaled stand-in model keeps its source's tokenizer.
                if uri.name == "scaled" {
                    return Self::from_pretrained(&param("from")?);
                }
                if uri.name != "tiny" {
                    return Err(source("unknown builtin tokenizer".into()));
                }
                Self::from_json(
                    &builtin::tokenizer_json_for(
                        &builtin::vision_tokens(&param("arch")?),
                        &builtin::tool_call_tokens(&param("tools")?),
                    ),
                    builtin::tokenizer_config_json(),
                    None,
                    &GenerationConfig::from_json(&builtin::generation_config_json()),
                )
                .map_err(source)
            }
            None => match verlc_hub::locate(path, None, &verlc_hub::HubEnv::from_env()) {
                Ok(loc) => Self::from_dir(loc.dir().unwrap_or(Path::new(path))),
                Err(e) => Err(TokenizerError::Source {
                    path: path.into(),
                    msg: e.to_string(),
                }),
            },
        }
    }

    /// `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` and the generation ids of `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(TokenizerError::NoTokenizer {
                dir: dir.to_owned(),
            });
        }
        let text =
            std::fs::read_to_string(&tok_path).map_err(|e| TokenizerError::io(&tok_path, e))?;
        let tok_json: Value = serde_json::from_str(&text).map_err(|e| TokenizerError::Config {
            file: tok_path.clone(),
            msg: e.to_string(),
        })?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if cfg_path.is_file() {
            let t =
                std::fs::read_to_string(&cfg_path).map_err(|e| TokenizerError::io(&cfg_path, e))?;
            serde_json::from_str(&t).map_err(|e| TokenizerError::Config {
                file: cfg_path.clone(),
                msg: e.to_string(),
            })?
        } else {
            Value::Object(Map::new())
        };
        let jinja_path = dir.join("chat_template.jinja");
        let jinja = if jinja_path.is_file() {
            Some(
                std::fs::read_to_string(&jinja_path)
                    .map_err(|e| TokenizerError::io(&jinja_path, e))?,
            )
        } else {
            None
        };
        let gen_cfg = GenerationConfig::from_dir(dir)?;
        Self::from_json(&tok_json, cfg, jinja, &gen_cfg).map_err(|msg| TokenizerError::Config {
            file: tok_path,
            msg,
        })
    }

    fn from_json(
        tok: &Value,
        cfg: Value,
        jinja: Option<String>,
        gen_cfg: &GenerationConfig,
    ) -> Result<Self, String> {
        let inner: tokenizers::Tokenizer =
            serde_json::from_value(tok.clone()).map_err(|e| e.to_string())?;
        let chat_source = jinja.or_else(|| default_template(&cfg));
        let chat = chat_source
            .as_deref()
            .map(ChatTemplate::new)
            .transpose()
            .map_err(|e| format!("chat template: {e:#}"))?;
        let mut special = Map::new();
        for key in [
            "bos_token",
            "eos_token",
            "unk_token",
            "sep_token",
            "pad_token",
            "cls_token",
            "mask_token",
        ] {
            if let Some(s) = token_str(cfg.get(key)) {
                special.insert(key.to_owned(), Value::String(s));
            }
        }
        let id_of = |key: &str| -> Option<i64> {
            let s = special.get(key)?.as_str()?;
            inner.token_to_id(s).map(i64::from)
        };
        let mut eos_token_ids = gen_cfg.eos_token_ids.clone();
        if let Some(id) = id_of("eos_token").filter(|id| !eos_token_ids.contains(id)) {
            eos_token_ids.push(id);
        }
        let pad_token_id = id_of("pad_token")
            .or(gen_cfg.pad_token_id)
            .or(eos_token_ids.first().copied())
            .ok_or("no pad token, pad_token_id or EOS id to pad with")?;
        Ok(Tokenizer {
            inner,
            chat,
            special,
            eos_token_ids,
            pad_token_id,
            generation: gen_cfg.clone(),
            config_json: cfg,
            chat_source,
        })
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// A special token's text from tokenizer_config.json (`"eos_token"`, `"bos_token"`, …).
    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.special.get(name).and_then(Value::as_str)
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some()
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| TokenizerError::Tokenizers(e.to_string()))?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    pub fn decode(&self, ids: &[i64], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        let size = self.vocab_size();
        let ids: Vec<u32> = ids
            .iter()
            .map(|&id| {
                u32::try_from(id)
                    .ok()
                    .filter(|&i| (i as usize) < size)
                    .ok_or(TokenizerError::BadId { id, size })
            })
            .collect::<Result<_, _>>()?;
        self.inner
            .decode(&ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Tokenizers(e.to_string()))
    }

    /// `apply_chat_template(messages, tokenize=False, add_generation_prompt=…, **kwargs)`.
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        kwargs: &Map<String, Value>,
    ) -> Result<String, TokenizerError> {
        let chat = self.chat.as_ref().ok_or(TokenizerError::NoChatTemplate)?;
        Ok(chat.render(messages, add_generation_prompt, &self.special, kwargs)?)
    }

    /// `apply_chat_template(messages, tokenize=True, …)`: render, then encode without adding
    /// special tokens.
    pub fn encode_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        kwargs: &Map<String, Value>,
    ) -> Result<Vec<i64>, TokenizerError> {
        self.encode(
            &self.apply_chat_template(messages, add_generation_prompt, kwargs)?,
            false,
        )
    }

    /// Writes `tokenizer.json` and `tokenizer_config.json` (with the chat template) to `dir`,
    /// e.g. next to a saved checkpoint; see also [`GenerationConfig::save`].
    pub fn save(&self, dir: &Path) -> Result<(), TokenizerError> {
        std::fs::create_dir_all(dir).map_err(|e| TokenizerError::io(dir, e))?;
        let tok_path = dir.join("tokenizer.json");
        self.inner
            .save(&tok_path, true)
            .map_err(|e| TokenizerError::Config {
                file: tok_path,
                msg: e.to_string(),
            })?;
        let cfg_path = dir.join("tokenizer_config.json");
        let mut cfg = self.config_json.clone();
        if let (Some(obj), Some(src)) = (cfg.as_object_mut(), &self.chat_source) {
            obj.insert("chat_template".into(), Value::String(src.clone()));
        }
        let text = serde_json::to_string_pretty(&cfg).map_err(|e| TokenizerError::Config {
            file: cfg_path.clone(),
            msg: e.to_string(),
        })?;
        std::fs::write(&cfg_path, text).map_err(|e| TokenizerError::io(&cfg_path, e))
    }
}
