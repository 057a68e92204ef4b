//! The tokenizer of `builtin://tiny`: a word/character-level vocabulary for the built-in
//! synthetic tasks (lowercased; digits one token each, a few words, punctuation, whitespace)
//! with Qwen-style chat tokens, built in memory as a `tokenizer.json` document.

use serde_json::{Value, json};

pub const PAD: &str = "<|endoftext|>";
pub const BOS_CHAT: &str = "<|im_start|>";
pub const EOS: &str = "<|im_end|>";
pub const UNK: &str = "<unk>";
pub const PAD_ID: i64 = 0;
pub const EOS_ID: i64 = 2;

const SPECIAL: [&str; 4] = [PAD, BOS_CHAT, EOS, UNK];
const PUNCT: [&str; 10] = [" ", "\n", ":", "+", "-", "*", "=", "?", ".", ","];
const WORDS: [&str; 14] = [
    "user",
    "assistant",
    "system",
    "reverse",
    "the",
    "digits",
    "of",
    "compute",
    "what",
    "is",
    "plus",
    "minus",
    "times",
    "answer",
];

/// Qwen-style template without a default system prompt (keeps prompts short); a message whose
/// content is a list of parts (a vision-language prompt) renders its text parts and, for each
/// image or video part, Qwen-VL's vision span.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The tokens in id order.
pub fn vocab() -> Vec<String> {
    let digits = (0..10).map(|d| d.to_string());
    SPECIAL
        .iter()
        .map(|s| s.to_string())
        .chain(digits)
        .chain(PUNCT.iter().chain(WORDS.iter()).map(|s| s.to_string()))
        .collect()
}

pub fn vocab_size() -> usize {
    SPECIAL.len() + 10 + PUNCT.len() + WORDS.len()
}

/// The tokens `builtin://tiny?tools=a,b` adds after the vocabulary: one per tool, the whole
/// argument-less `hermes` call of that tool (so a tiny model calls a tool with one token).
pub fn tool_call_tokens(tools: &str) -> Vec<String> {
    tools
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|t| format!("<tool_call>{{\"name\": \"{t}\", \"arguments\": {{}}}}</tool_call>"))
        .collect()
}

/// The `tokenizer.json` document (WordLevel model, isolating split, fusing decoder).
pub fn tokenizer_json() -> Value {
    tokenizer_json_for(&[], &[])
}

/// The vision tokens of the tokenizer of the tiny family `arch`: Qwen-VL's for a family with
/// a vision tower, none for the others.
pub fn vision_tokens(arch: &str) -> Vec<String> {
    if verlc_spec::builtin::tiny_arch_has_vision(arch) {
        verlc_spec::builtin::TINY_VISION_TOKENS
            .iter()
            .map(|t| t.to_string())
            .collect()
    } else {
        Vec::new()
    }
}

/// [`tokenizer_json`] with the special tokens `vision` ([`vision_tokens`]) then `extra`
/// tokens ([`tool_call_tokens`]) after the vocabulary, these added as non-special whole-text
/// tokens (decoding keeps them, as the call parser needs).
pub fn tokenizer_json_for(vision: &[String], extra: &[String]) -> Value {
    let base = vocab_size() + vision.len();
    let vocab: serde_json::Map<String, Value> = vocab()
        .into_iter()
        .chain(vision.iter().cloned())
        .chain(extra.iter().cloned())
        .enumerate()
        .map(|(i, t)| (t, json!(i)))
        .collect();
    let added: Vec<Value> = SPECIAL
        .iter()
        .enumerate()
        .filter(|(_, t)| **t != UNK)
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .chain(vision.iter().enumerate().map(|(i, t)| {
            json!({"id": vocab_size() + i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        }))
        .chain(extra.iter().enumerate().map(|(i, t)| {
            json!({"id": base + i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": false})
        }))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": "[a-z]+|[0-9]|\\s|[^a-z0-9\\s]"},
            "behavior": "Isolated",
            "invert": false
        },
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": UNK}
    })
}

/// The `tokenizer_config.json` document.
pub fn tokenizer_config_json() -> Value {
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 256,
        "clean_up_tokenization_spaces": false
    })
}

/// The `generation_config.json` document.
pub fn generation_config_json() -> Value {
    json!({"eos_token_id": [EOS_ID], "pad_token_id": PAD_ID, "bos_token_id": null})
}
