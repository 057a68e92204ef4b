//! The tokenizer of `builtin://tiny`: short prompts for the synthetic tasks, exact decoding.

use serde_json::Map;
use verlc_runtime::tokenizer::{Message, Tokenizer, builtin};

#[test]
fn builtin_prompts_are_short_and_round_trip() {
    let tok = Tokenizer::from_pretrained("builtin://tiny").unwrap();
    assert_eq!(tok.vocab_size(), builtin::vocab_size());
    // The compiler's copy of the size (it has no tokenizer), tools adding one token each.
    assert_eq!(
        builtin::vocab_size() as i64,
        verlc_spec::builtin::tiny_vocab("builtin://tiny")
    );
    let with_tools = "builtin://tiny?tools=calc,lookup";
    let uri = verlc_runtime::builtin_uri::BuiltinUri::parse(with_tools)
        .expect("a builtin address")
        .expect("well formed");
    assert_eq!(
        verlc_runtime::model::builtin::config(&uri).map(|m| m.vocab_size),
        Ok(verlc_spec::builtin::tiny_vocab(with_tools))
    );
    assert_eq!(tok.eos_token_ids, vec![builtin::EOS_ID]);
    assert_eq!(tok.pad_token_id, builtin::PAD_ID);
    let msgs = [Message::user("reverse 40213")];
    let text = tok.apply_chat_template(&msgs, true, &Map::new()).unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nreverse 40213<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode_chat(&msgs, true, &Map::new()).unwrap();
    assert_eq!(ids.len(), 15, "{ids:?}");
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(
        tok.decode(&tok.encode("31204", false).unwrap(), true)
            .unwrap(),
        "31204"
    );
    let with_eos = [tok.encode("31204", false).unwrap(), vec![builtin::EOS_ID]].concat();
    assert_eq!(tok.decode(&with_eos, true).unwrap(), "31204");
    // Text is lowercased; unknown words become <unk> instead of failing.
    assert_eq!(
        tok.encode("Reverse 1", false).unwrap(),
        tok.encode("reverse 1", false).unwrap()
    );
    assert_eq!(
        tok.encode("Hello", false).unwrap(),
        vec![tok.token_to_id(builtin::UNK).unwrap()]
    );
}

#[test]
fn builtin_tokenizer_saves_for_transformers_layout() {
    let tok = Tokenizer::from_pretrained("builtin://tiny").unwrap();
    let dir = std::env::temp_dir().join(format!("verlc-tok-save-{}", std::process::id()));
    tok.save(&dir).unwrap();
    let back = Tokenizer::from_dir(&dir).unwrap();
    let msgs = [Message::user("compute 12+34")];
    assert_eq!(
        back.encode_chat(&msgs, true, &Map::new()).unwrap(),
        tok.encode_chat(&msgs, true, &Map::new()).unwrap()
    );
    assert_eq!(back.pad_token_id, tok.pad_token_id);
    let _ = std::fs::remove_dir_all(&dir);
}
