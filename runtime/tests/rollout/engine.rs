//! Batched generation: token-for-token parity with transformers' greedy generate on
//! left-padded batches, stopping at EOS, verl's output layout, n samples per prompt.

use tch::{Device, Kind, Tensor};
use verlc_runtime::model::{Dtype, from_pretrained};
use verlc_runtime::rollout::{SamplingParams, StopTokens, generate, generate_padded};

use crate::oracle;

fn rows(t: &Tensor) -> Vec<Vec<i64>> {
    Vec::<Vec<i64>>::try_from(t).unwrap()
}

#[test]
fn greedy_matches_transformers_generate() {
    let dir = oracle::models();
    for arch in oracle::GEN_ARCHS {
        let m = from_pretrained(
            dir.join(arch).to_str().unwrap(),
            Device::Cpu,
            Dtype::Fp32,
            0,
        )
        .unwrap()
        .model;
        let spec = oracle::json(&dir.join(format!("{arch}_greedy.json")));
        let prompts: Vec<Vec<i64>> = serde_json::from_value(spec["prompts"].clone()).unwrap();
        let expected: Vec<Vec<i64>> = serde_json::from_value(spec["outputs"].clone()).unwrap();
        let eos = spec["eos"].as_i64().unwrap();
        let params = SamplingParams::greedy(spec["max_new_tokens"].as_u64().unwrap() as usize);
        let out = generate(
            &m,
            &prompts,
            &params,
            &StopTokens {
                eos: vec![eos],
                pad: 0,
            },
        )
        .unwrap();
        let got = rows(&out.responses);
        for (i, want) in expected.iter().enumerate() {
            assert_eq!(
                &got[i][..out.response_lengths[i]],
                want.as_slice(),
                "{arch}: prompt {i}"
            );
            assert_eq!(
                out.finished[i],
                want.last() == Some(&eos),
                "{arch}: prompt {i} finished flag"
            );
        }
    }
}

#[test]
fn output_layout_follows_verl() {
    let m = from_pretrained(
        "builtin://tiny?layers=2&hidden=64",
        Device::Cpu,
        Dtype::Fp32,
        3,
    )
    .unwrap()
    .model;
    let prompts = vec![vec![5i64, 6, 7, 8], vec![9i64, 10]];
    let params = SamplingParams {
        max_new_tokens: 12,
        n: 3,
        seed: 1,
        ..SamplingParams::default()
    };
    // Stop on a frequent token so some rows end early.
    let out = generate(
        &m,
        &prompts,
        &params,
        &StopTokens {
            eos: vec![4, 5, 6, 7, 8, 9],
            pad: 0,
        },
    )
    .unwrap();
    assert_eq!(out.prompts.size(), [6, 4]);
    assert_eq!(out.responses.size(), [6, 12]);
    assert_eq!(out.input_ids.size(), [6, 16]);
    assert_eq!(out.prompt_index, vec![0, 0, 0, 1, 1, 1]);
    let prompts_rows = rows(&out.prompts);
    assert_eq!(
        prompts_rows[4],
        vec![0, 0, 9, 10],
        "left padding with the pad id"
    );
    let am = rows(&out.attention_mask);
    let pos = rows(&out.position_ids);
    let rm = rows(&out.response_mask);
    let resp = rows(&out.responses);
    for i in 0..6 {
        let len = out.response_lengths[i];
        assert!(len >= 1);
        assert_eq!(rm[i].iter().sum::<i64>() as usize, len);
        assert!(rm[i][..len].iter().all(|&x| x == 1) && rm[i][len..].iter().all(|&x| x == 0));
        assert_eq!(
            &am[i][4..],
            rm[i].as_slice(),
            "response part of attention_mask is the response mask"
        );
        if out.finished[i] {
            assert!((4..=9).contains(&resp[i][len - 1]), "ends with its EOS");
            assert!(resp[i][len..].iter().all(|&t| t == 0), "padded after EOS");
        } else {
            assert_eq!(len, 12);
        }
        let valid = am[i][..4].iter().sum::<i64>();
        assert_eq!(pos[i][3], valid - 1);
        assert_eq!(pos[i][4..], (valid..valid + 12).collect::<Vec<_>>()[..]);
    }
    assert!(out.finished.iter().any(|&f| f), "some rows stop at EOS");
    let lp = out.rollout_log_probs.shallow_clone();
    assert_eq!(lp.kind(), Kind::Float);
    let masked = (&lp * (out.response_mask.ones_like() - &out.response_mask))
        .abs()
        .max()
        .double_value(&[]);
    assert_eq!(masked, 0.0, "log-probs are zero outside the response mask");
    assert!(lp.le(0.0).all().int64_value(&[]) == 1);
}

#[test]
fn ignore_eos_runs_to_the_length_limit() {
    let m = from_pretrained(
        "builtin://tiny?layers=1&hidden=32&heads=2&kv_heads=1",
        Device::Cpu,
        Dtype::Fp32,
        3,
    )
    .unwrap()
    .model;
    let params = SamplingParams {
        max_new_tokens: 9,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let stop = StopTokens {
        eos: (0..m.config.vocab_size).collect(),
        pad: 0,
    };
    let out = generate(&m, &[vec![5, 6]], &params, &stop).unwrap();
    assert_eq!(out.response_lengths, vec![9]);
    assert_eq!(out.finished, vec![false]);
}

#[test]
fn bad_prompts_are_rejected_with_their_index() {
    let m = from_pretrained(
        "builtin://tiny?layers=1&hidden=32&heads=2&kv_heads=1",
        Device::Cpu,
        Dtype::Fp32,
        3,
    )
    .unwrap()
    .model;
    let stop = StopTokens {
        eos: vec![2],
        pad: 0,
    };
    let e = generate(&m, &[vec![5], vec![]], &SamplingParams::default(), &stop)
        .unwrap_err()
        .to_string();
    assert!(e.contains("prompt 1") && e.contains("empty"), "{e}");
    let e = generate(&m, &[vec![5, 999]], &SamplingParams::default(), &stop)
        .unwrap_err()
        .to_string();
    assert!(e.contains("prompt 0") && e.contains("999"), "{e}");
    let bad = SamplingParams {
        top_p: 0.0,
        ..SamplingParams::default()
    };
    assert!(
        generate(&m, &[vec![5]], &bad, &stop)
            .unwrap_err()
            .to_string()
            .contains("top_p")
    );
}

#[test]
fn prompts_pad_to_a_fixed_width() {
    let m = from_pretrained(
        "builtin://tiny?layers=1&hidden=32&heads=2&kv_heads=1",
        Device::Cpu,
        Dtype::Fp32,
        3,
    )
    .unwrap()
    .model;
    let stop = StopTokens {
        eos: vec![2],
        pad: 0,
    };
    let params = SamplingParams::greedy(4);
    let prompts = [vec![5, 6, 7], vec![8]];
    let fixed = generate_padded(&m, &prompts, &params, &stop, Some(6)).unwrap();
    assert_eq!(fixed.prompts.size(), [2, 6]);
    let tight = generate(&m, &prompts, &params, &stop).unwrap();
    assert!(
        fixed.responses.equal(&tight.responses),
        "padding width does not change greedy tokens"
    );
    let e = generate_padded(&m, &prompts, &params, &stop, Some(2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("exceed prompt_width = 2"), "{e}");
}

#[test]
fn ended_rows_leave_the_batch_without_changing_any_row() {
    let m = from_pretrained(
        "builtin://tiny?layers=2&hidden=64",
        Device::Cpu,
        Dtype::Fp32,
        3,
    )
    .unwrap()
    .model;
    let prompts: Vec<Vec<i64>> = (0..8).map(|i| vec![4 + i, 5, 6 + i % 3]).collect();
    let stop = StopTokens {
        eos: vec![2, 3],
        pad: 0,
    };
    let params = SamplingParams {
        max_new_tokens: 48,
        n: 3,
        seed: 17,
        temperature: 1.5,
        ..SamplingParams::default()
    };
    let together = generate(&m, &prompts, &params, &stop).unwrap();
    // The reference: one pass per prompt (the same row streams, 3 rows a pass), where rows
    // leave a batch far less often.
    let alone = generate(
        &m,
        &prompts,
        &SamplingParams {
            max_prompts_per_pass: Some(1),
            ..params.clone()
        },
        &stop,
    )
    .unwrap();
    let lengths = &together.response_lengths;
    let ended = together.finished.iter().filter(|&&f| f).count();
    assert!(
        ended >= 6 && ended < lengths.len(),
        "the case needs rows ending at different steps and rows running to the limit: {lengths:?}"
    );
    assert_eq!(rows(&together.responses), rows(&alone.responses));
    assert_eq!(lengths, &alone.response_lengths);
    let diff = (&together.rollout_log_probs - &alone.rollout_log_probs)
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < 1e-5, "log-probs differ by {diff}");
    // Rows run through the model: about the generated tokens (a row leaves once an eighth of
    // the batch has ended), far fewer than every row for the whole length.
    let generated: usize = lengths.iter().sum();
    let full = lengths.len() * (params.max_new_tokens - 1);
    assert!(
        together.decoded_rows < full && together.decoded_rows <= generated + generated / 4,
        "decoded {} rows for {generated} tokens (no compaction: {full})",
        together.decoded_rows
    );
}
