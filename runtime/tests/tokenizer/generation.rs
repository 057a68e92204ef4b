//! EOS/pad ids from generation_config.json, falling back to config.json.

use serde_json::json;
use verlc_runtime::tokenizer::GenerationConfig;

use crate::oracle;

#[test]
fn generation_config_single_and_list_eos() {
    let g = GenerationConfig::from_json(
        &json!({"eos_token_id": [151645, 151643], "pad_token_id": 151643}),
    );
    assert_eq!(g.eos_token_ids, vec![151645, 151643]);
    assert_eq!(g.pad_token_id, Some(151643));
    let g = GenerationConfig::from_json(&json!({"eos_token_id": 2, "bos_token_id": 1}));
    assert_eq!(
        (g.eos_token_ids, g.bos_token_id, g.pad_token_id),
        (vec![2], Some(1), None)
    );
}

#[test]
fn generation_config_falls_back_to_config_json() {
    let model = oracle::models().join("qwen2");
    assert_eq!(
        GenerationConfig::from_dir(&model).unwrap().eos_token_ids,
        vec![2]
    );
    let only_config = oracle::scratch("only-config");
    std::fs::copy(model.join("config.json"), only_config.join("config.json")).unwrap();
    let g = GenerationConfig::from_dir(&only_config).unwrap();
    assert_eq!((g.eos_token_ids, g.pad_token_id), (vec![2], Some(0)));
}

#[test]
fn generation_config_saves_what_it_reads() {
    let dir = oracle::scratch("gen-save");
    let g = GenerationConfig {
        eos_token_ids: vec![7, 9],
        pad_token_id: Some(0),
        bos_token_id: None,
    };
    g.save(&dir).unwrap();
    assert_eq!(GenerationConfig::from_dir(&dir).unwrap(), g);
    let one = GenerationConfig {
        eos_token_ids: vec![7],
        ..g
    };
    one.save(&dir).unwrap();
    let text = std::fs::read_to_string(dir.join("generation_config.json")).unwrap();
    assert!(text.contains("\"eos_token_id\": 7"), "{text}");
}
