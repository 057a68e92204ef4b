//! Batched generation: token-for-token parity with transformers' greedy generate on
//! left-padded batches, stopping at EOS, verl's output layout, n samples per prompt.

use tch::{Device, Kind, Tensor};
use verlc_runtime::logits::SequenceBatch;
use verlc_runtime::model::{Dtype, from_pretrained};
use verlc_runtime::rollout::{
    GenerateInput, PromptStream, RolloutError, RowVersions, SamplingParams, StopTokens,
    compute_log_probs, generate, generate_interruptible, generate_padded,
};

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

/// `model`'s variables take `from`'s values (a weight sync while the model decodes).
fn bind_weights(model: &tch::nn::VarStore, from: &tch::nn::VarStore) {
    let source = from.variables();
    tch::no_grad(|| {
        for (name, var) in model.variables() {
            var.shallow_clone().set_data(&source[&name].detach_copy());
        }
    });
}

/// verl's partial rollout on the built-in engine: weights that change while a batch decodes
/// (before token 5 here) are taken by the rows still decoding, which are prefilled again with
/// them (prompt and response so far) and go on with their own sampling streams. With the same
/// weights bound again the batch is the uninterrupted one; with other weights every token
/// before the swap is the old weights' and keeps their log-prob, and every token after it has
/// the new weights' log-prob given the whole row (the training forward's, teacher-forced), and
/// each row says which versions made it.
#[test]
fn weights_that_change_mid_batch_continue_the_rows_still_decoding() {
    let load = |seed| {
        from_pretrained(
            "builtin://tiny?layers=2&hidden=64",
            Device::Cpu,
            Dtype::Fp32,
            seed,
        )
        .unwrap()
    };
    let (old, new, decoding) = (load(3), load(4), load(3));
    let prompts: Vec<Vec<i64>> = (0..6)
        .map(|i| vec![4 + i, 5, 6 + i % 3, 7][..2 + i as usize % 3].to_vec())
        .collect();
    let stop = StopTokens {
        eos: vec![2, 3],
        pad: 0,
    };
    let params = SamplingParams {
        max_new_tokens: 20,
        n: 3,
        seed: 17,
        temperature: 1.5,
        ..SamplingParams::default()
    };
    let streams = PromptStream::consecutive(params.seed, 0, prompts.len());
    let input = GenerateInput {
        prompts: &prompts,
        images: &[],
        streams: &streams,
        prompt_width: None,
    };
    let whole = generate(&old.model, &prompts, &params, &stop).unwrap();
    const SWAP_AT: usize = 5;
    let run = |with: &tch::nn::VarStore| {
        let mut polls = 0;
        let mut swap = || -> Result<Option<u64>, RolloutError> {
            polls += 1;
            if polls == SWAP_AT + 1 {
                bind_weights(&decoding.vs, with);
                return Ok(Some(7));
            }
            Ok(None)
        };
        let out =
            generate_interruptible(&decoding.model, input, &params, &stop, &mut swap).unwrap();
        bind_weights(&decoding.vs, &old.vs);
        out
    };

    // The same weights again: the uninterrupted batch.
    let same = run(&old.vs);
    assert_eq!(rows(&same.responses), rows(&whole.responses));
    let d = oracle::max_abs_diff(&same.rollout_log_probs, &whole.rollout_log_probs);
    assert!(d <= 1e-5, "log-probs differ by {d}");
    let ended_before: Vec<bool> = whole
        .response_lengths
        .iter()
        .zip(&whole.finished)
        .map(|(&len, &fin)| fin && len <= SWAP_AT)
        .collect();
    assert!(
        ended_before.iter().any(|&e| e) && ended_before.iter().any(|&e| !e),
        "the case needs rows that end before the swap and rows that decode through it: {:?}",
        whole.response_lengths
    );
    let want: Vec<RowVersions> = ended_before
        .iter()
        .map(|&e| RowVersions {
            first: None,
            last: (!e).then_some(7),
        })
        .collect();
    assert_eq!(same.versions, want);

    // Other weights: the old ones' tokens before the swap, the new ones' after it.
    let swapped = run(&new.vs);
    assert_eq!(swapped.versions, want);
    let got = rows(&swapped.responses);
    let before: Vec<Vec<i64>> = rows(&whole.responses)
        .iter()
        .map(|r| r[..SWAP_AT].to_vec())
        .collect();
    assert_eq!(
        got.iter()
            .map(|r| r[..SWAP_AT].to_vec())
            .collect::<Vec<_>>(),
        before
    );
    assert_ne!(
        got,
        rows(&whole.responses),
        "the new weights chose other tokens"
    );
    let batch = SequenceBatch {
        input_ids: &swapped.input_ids,
        attention_mask: &swapped.attention_mask,
        position_ids: &swapped.position_ids,
    };
    let r = params.max_new_tokens as i64;
    let mask = swapped.response_mask.to_kind(Kind::Float);
    let forced = |m| {
        compute_log_probs(m, &batch, r, params.temperature, 8, false)
            .unwrap()
            .log_probs
            * &mask
    };
    let (by_old, by_new) = (forced(&old.model), forced(&new.model));
    let cut = SWAP_AT as i64;
    let head = oracle::max_abs_diff(
        &swapped.rollout_log_probs.narrow(1, 0, cut),
        &by_old.narrow(1, 0, cut),
    );
    let tail = oracle::max_abs_diff(
        &swapped.rollout_log_probs.narrow(1, cut, r - cut),
        &by_new.narrow(1, cut, r - cut),
    );
    assert!(
        head <= 1e-5 && tail <= 1e-5,
        "log-probs: {head} before the swap, {tail} after"
    );
}
