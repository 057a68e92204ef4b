//! Log-probs of given sequences through the training forward, in micro-batches: they equal
//! the rollout's decode-time log-probs, and entropy/mismatch metrics are consistent.

use tch::{Device, Kind, Tensor};
use verlc_runtime::logits::{SequenceBatch, entropy_from_logits, probs_diff};
use verlc_runtime::model::{Dtype, from_pretrained};
use verlc_runtime::rollout::{
    LogProbPath, SamplingParams, StopTokens, compute_log_probs, generate,
};

use crate::oracle;

#[test]
fn recomputed_log_probs_match_decode_log_probs() {
    let dir = oracle::models();
    let m = from_pretrained(
        dir.join("qwen3").to_str().unwrap(),
        Device::Cpu,
        Dtype::Fp32,
        0,
    )
    .unwrap()
    .model;
    let prompts = vec![vec![5i64, 6, 7, 8, 9], vec![10i64, 11], vec![12i64, 13, 14]];
    let params = SamplingParams {
        max_new_tokens: 10,
        n: 2,
        temperature: 0.7,
        seed: 3,
        ..SamplingParams::default()
    };
    let stop = StopTokens {
        eos: vec![2],
        pad: 0,
    };
    let out = generate(&m, &prompts, &params, &stop).unwrap();
    let batch = SequenceBatch {
        input_ids: &out.input_ids,
        attention_mask: &out.attention_mask,
        position_ids: &out.position_ids,
    };
    for micro in [1, 4, 16] {
        let lp = compute_log_probs(&m, &batch, 10, 0.7, micro, true).unwrap();
        let masked = &lp.log_probs * out.response_mask.to_kind(Kind::Float);
        let d = oracle::max_abs_diff(&masked, &out.rollout_log_probs);
        assert!(
            d <= 1e-5,
            "micro {micro}: training-path log-probs differ from decode by {d}"
        );
        let ent = lp.entropy.unwrap();
        assert_eq!(ent.size(), [6, 10]);
        assert!(ent.ge(0.0).all().int64_value(&[]) == 1);
        let diff = probs_diff(&out.rollout_log_probs, &lp.log_probs, &out.response_mask);
        assert!(diff.max < 1e-5 && diff.pearson > 0.9999, "{diff:?}");
    }
    let recomputed = generate(
        &m,
        &prompts,
        &SamplingParams {
            log_prob_path: LogProbPath::Recompute,
            ..params
        },
        &stop,
    )
    .unwrap();
    assert!(recomputed.responses.equal(&out.responses));
    assert!(oracle::max_abs_diff(&recomputed.rollout_log_probs, &out.rollout_log_probs) <= 1e-5);
}

#[test]
fn entropy_of_uniform_and_peaked() {
    let logits = Tensor::from_slice(&[0.0f32, 0.0, 0.0, 0.0, 100.0, 0.0, 0.0, 0.0]).view([2, 4]);
    let e: Vec<f32> = Vec::try_from(entropy_from_logits(&logits)).unwrap();
    assert!((e[0] as f64 - 4f64.ln()).abs() < 1e-6);
    assert!(e[1].abs() < 1e-6);
}

#[test]
fn invalid_batches_are_rejected() {
    let m = from_pretrained(
        "builtin://tiny?layers=1&hidden=32&heads=2&kv_heads=1",
        Device::Cpu,
        Dtype::Fp32,
        3,
    )
    .unwrap()
    .model;
    let ids = Tensor::ones([2, 5], (Kind::Int64, Device::Cpu));
    let short = Tensor::ones([2, 4], (Kind::Int64, Device::Cpu));
    let b = SequenceBatch {
        input_ids: &ids,
        attention_mask: &short,
        position_ids: &ids,
    };
    assert!(compute_log_probs(&m, &b, 2, 1.0, 1, false).is_err());
    let b = SequenceBatch {
        input_ids: &ids,
        attention_mask: &ids,
        position_ids: &ids,
    };
    assert!(compute_log_probs(&m, &b, 5, 1.0, 1, false).is_err());
}
