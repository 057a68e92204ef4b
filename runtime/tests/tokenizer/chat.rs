//! Chat-template output and ids equal transformers' `apply_chat_template` for a Qwen2.5
//! template and a Qwen3-style one (namespace, reverse slicing, string methods,
//! `enable_thinking`), with tools (`tojson`), tool calls and tool responses.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use verlc_runtime::tokenizer::{Message, Tokenizer};

use crate::oracle;

fn chat_oracle() -> PathBuf {
    let t = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle");
    let templates = [
        t.join("qwen2_5_chat_template.jinja"),
        t.join("qwen3_style_chat_template.jinja"),
    ];
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| oracle::cached("tokenizer", &[&templates[0], &templates[1]]))
        .clone()
}

fn check_all(dir_of: impl Fn(&str) -> PathBuf) {
    let out = chat_oracle();
    let cases = oracle::json(&out.join("chat.json"));
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 12);
    for case in cases {
        let tok_name = case["tokenizer"].as_str().unwrap();
        let tok = Tokenizer::from_dir(&dir_of(tok_name)).unwrap();
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let mut kwargs: Map<String, Value> = case
            .get("kwargs")
            .and_then(|k| k.as_object().cloned())
            .unwrap_or_default();
        if let Some(tools) = case.get("tools") {
            kwargs.insert("tools".into(), tools.clone());
        }
        let gen_prompt = case["add_generation_prompt"].as_bool().unwrap();
        let text = tok
            .apply_chat_template(&messages, gen_prompt, &kwargs)
            .unwrap();
        assert_eq!(
            text,
            case["text"].as_str().unwrap(),
            "{tok_name} case {}",
            case["case"]
        );
        let ids = tok.encode_chat(&messages, gen_prompt, &kwargs).unwrap();
        let want: Vec<i64> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(ids, want, "{tok_name} case {} ids", case["case"]);
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            text,
            "decode inverts encode"
        );
    }
}

#[test]
fn chat_template_matches_transformers() {
    let out = chat_oracle();
    check_all(|name| out.join(name));
}

#[test]
fn template_in_tokenizer_config_works_like_chat_template_jinja() {
    let out = chat_oracle();
    let copies = oracle::scratch("tok-config-template");
    for name in ["tok0", "tok1"] {
        let dst = copies.join(name);
        std::fs::create_dir_all(&dst).unwrap();
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(out.join(name).join(f), dst.join(f)).unwrap();
        }
        let template = std::fs::read_to_string(out.join(name).join("chat_template.jinja")).unwrap();
        let cfg_path = dst.join("tokenizer_config.json");
        let mut cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg["chat_template"] = Value::String(template);
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    }
    check_all(|name| copies.join(name));
}

#[test]
fn special_ids_and_errors() {
    let out = chat_oracle();
    let tok = Tokenizer::from_dir(&out.join("tok0")).unwrap();
    assert_eq!(tok.eos_token_ids, vec![2], "<|im_end|>");
    assert_eq!(tok.pad_token_id, 0, "<|endoftext|>");
    let e = Tokenizer::from_dir(&oracle::scratch("no-tokenizer"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no tokenizer.json"), "{e}");
    assert!(
        tok.decode(&[1_000_000], false)
            .unwrap_err()
            .to_string()
            .contains("outside the vocabulary")
    );
    let bad = verlc_runtime::tokenizer::ChatTemplate::new("{% if %}").unwrap_err();
    assert!(!bad.to_string().is_empty());
    let raising = verlc_runtime::tokenizer::ChatTemplate::new(
        "{{ raise_exception('only user and assistant roles') }}",
    )
    .unwrap();
    let e = raising
        .render(&[Message::user("x")], true, &Map::new(), &Map::new())
        .unwrap_err();
    assert!(format!("{e:#}").contains("only user and assistant roles"));
}
