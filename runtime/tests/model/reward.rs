//! Reward models score as transformers' `*ForSequenceClassification` does (the one-label
//! logit at the last token), on tiny random Qwen2 and Llama checkpoints with their own
//! tokenizer and chat template (`model_oracle.py reward`): the reward model's input ids equal
//! `apply_chat_template` + `tokenizer(..., add_special_tokens=False)`, the scores of one
//! left-padded micro-batch the right-padded batch of transformers, and inputs cut at
//! `max_length` score as the cut ids do.

use std::path::PathBuf;

use tch::Device;
use verlc_runtime::model::Dtype;
use verlc_runtime::tokenizer::{Message, Tokenizer};
use verlc_runtime::workers::reward::{RewardInput, RewardModel};
use verlc_spec::data::Truncation;
use verlc_spec::trainer::{RewardModelInput, RewardModelSpec};

use crate::oracle;

fn reward_oracle() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let template = oracle::script_named("qwen2_5_chat_template.jinja");
        oracle::cached("reward", &[&template])
    })
    .clone()
}

fn spec(path: &std::path::Path, input: RewardModelInput) -> RewardModelSpec {
    RewardModelSpec {
        model_path: path.display().to_string(),
        input,
        dtype: None,
        micro_batch: 3,
        seed: 0,
        scores_validation: false,
    }
}

fn chat(max_length: Option<usize>, truncation: Truncation) -> RewardModelInput {
    RewardModelInput::Chat {
        add_special_tokens: false,
        max_length,
        truncation,
    }
}

fn close(ours: &[f64], theirs: &[f64], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}");
    for (a, b) in ours.iter().zip(theirs) {
        assert!(
            (a - b).abs() <= 1e-4,
            "{what}: {ours:?} vs transformers {theirs:?}"
        );
    }
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

#[test]
fn reward_models_score_as_transformers_sequence_classifiers() {
    let dir = reward_oracle();
    for arch in ["qwen2", "llama"] {
        let r = oracle::json(&dir.join(format!("rm_{arch}.json")));
        let chats: Vec<Vec<Message>> = serde_json::from_value(r["chats"].clone()).expect("chats");
        let ids: Vec<Vec<i64>> = serde_json::from_value(r["ids"].clone()).expect("ids");
        let path = dir.join(format!("rm_{arch}"));

        let rm = RewardModel::load(
            &spec(&path, chat(None, Truncation::Right)),
            Dtype::Fp32,
            Device::Cpu,
        )
        .expect("load reward model");
        assert_eq!(
            rm.encode_chats(&chats).expect("encode"),
            ids,
            "{arch}: input ids"
        );
        // 4 rows in micro-batches of 3: left padding in the first, none in the second.
        close(
            &rm.score_ids(&ids).expect("score"),
            &floats(&r["scores"]),
            arch,
        );

        let cut = RewardModel::load(
            &spec(&path, chat(Some(9), Truncation::Right)),
            Dtype::Fp32,
            Device::Cpu,
        )
        .expect("load");
        let cut_ids = cut.encode_chats(&chats).expect("encode");
        assert!(cut_ids.iter().all(|r| r.len() == 9));
        close(
            &cut.score_ids(&cut_ids).expect("score"),
            &floats(&r["cut9_scores"]),
            arch,
        );

        let strict = RewardModel::load(
            &spec(&path, chat(Some(9), Truncation::Error)),
            Dtype::Fp32,
            Device::Cpu,
        )
        .expect("load");
        let err = strict.encode_chats(&chats).unwrap_err().to_string();
        assert!(err.contains("reward_model.max_length = 9"), "{err}");
    }
}

#[test]
fn responses_reach_the_reward_model_as_verl_sends_them() {
    let dir = reward_oracle();
    let r = oracle::json(&dir.join("rm_qwen2.json"));
    let chats: Vec<Vec<Message>> = serde_json::from_value(r["chats"].clone()).expect("chats");
    let ids: Vec<Vec<i64>> = serde_json::from_value(r["ids"].clone()).expect("ids");
    let path = dir.join("rm_qwen2");
    let policy = Tokenizer::from_pretrained(path.to_str().expect("utf-8")).expect("tokenizer");
    let expected = floats(&r["scores"]);

    // The policy's response tokens end with its EOS, which verl removes from the decoded
    // text before the reward model's template adds its own end of turn.
    let responses: Vec<Vec<i64>> = chats
        .iter()
        .map(|c| {
            let answer = c
                .last()
                .and_then(|m| m.content.as_str())
                .expect("assistant text");
            policy
                .encode(&format!("{answer}<|im_end|>"), false)
                .expect("encode")
        })
        .collect();
    let inputs: Vec<RewardInput<'_>> = chats
        .iter()
        .zip(&responses)
        .map(|(c, resp)| RewardInput {
            messages: &c[..c.len() - 1],
            prompt_ids: &[],
            response_ids: resp,
        })
        .collect();
    let rm = RewardModel::load(
        &spec(&path, chat(None, Truncation::Right)),
        Dtype::Fp32,
        Device::Cpu,
    )
    .expect("load");
    close(
        &rm.score(&policy, &inputs).expect("score"),
        &expected,
        "chat input",
    );

    // With the policy's own tokens (input_tokenizer: null) the reward model reads prompt and
    // response ids as they are.
    let tokens = RewardModel::load(
        &spec(&path, RewardModelInput::PolicyTokens),
        Dtype::Fp32,
        Device::Cpu,
    )
    .expect("load");
    let split: Vec<RewardInput<'_>> = ids
        .iter()
        .map(|row| RewardInput {
            messages: &[],
            prompt_ids: &row[..5],
            response_ids: &row[5..],
        })
        .collect();
    close(
        &tokens.score(&policy, &split).expect("score"),
        &expected,
        "policy tokens",
    );
}

#[test]
fn a_causal_lm_is_no_reward_model() {
    let lm = oracle::models().join("qwen2");
    let err = RewardModel::load(
        &spec(&lm, RewardModelInput::PolicyTokens),
        Dtype::Fp32,
        Device::Cpu,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("score.weight"), "{err}");
}
