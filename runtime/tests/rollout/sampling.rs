//! Seeded sampling: reproducible, independent of how prompts are batched, and distributed as
//! the filtered softmax says.

use tch::{Device, Kind, Tensor};
use verlc_runtime::model::{Dtype, from_pretrained};
use verlc_runtime::rng::Rng;
use verlc_runtime::rollout::sampling::{sample, top_k_filter, top_p_filter, uniforms};
use verlc_runtime::rollout::vocab_head::{DecodeHead, HeadLogits};
use verlc_runtime::rollout::{SamplingParams, StopTokens, generate};

fn tiny() -> verlc_runtime::model::CausalLm {
    from_pretrained(
        "builtin://tiny?layers=2&hidden=64",
        Device::Cpu,
        Dtype::Fp32,
        9,
    )
    .unwrap()
    .model
}

fn responses(
    m: &verlc_runtime::model::CausalLm,
    prompts: &[Vec<i64>],
    p: &SamplingParams,
) -> Vec<Vec<i64>> {
    let out = generate(
        m,
        prompts,
        p,
        &StopTokens {
            eos: vec![2],
            pad: 0,
        },
    )
    .unwrap();
    Vec::<Vec<i64>>::try_from(&out.responses).unwrap()
}

#[test]
fn fixed_seed_is_reproducible_and_batching_invariant() {
    let m = tiny();
    let prompts: Vec<Vec<i64>> = (0..5)
        .map(|i| vec![4 + i, 5, 6 + i, 7][..(2 + i as usize % 3)].to_vec())
        .collect();
    let p = SamplingParams {
        max_new_tokens: 10,
        n: 2,
        seed: 42,
        top_k: 20,
        top_p: 0.9,
        temperature: 1.3,
        ..SamplingParams::default()
    };
    let a = responses(&m, &prompts, &p);
    // Other work on libtorch's global generator must not matter.
    let _ = Tensor::rand([100], (Kind::Float, Device::Cpu));
    let b = responses(&m, &prompts, &p);
    assert_eq!(a, b, "same seed, same responses");
    let chunked = responses(
        &m,
        &prompts,
        &SamplingParams {
            max_prompts_per_pass: Some(2),
            ..p.clone()
        },
    );
    assert_eq!(
        a, chunked,
        "per-sequence streams: chunking does not change samples"
    );
    let c = responses(
        &m,
        &prompts,
        &SamplingParams {
            seed: 43,
            ..p.clone()
        },
    );
    assert_ne!(a, c, "another seed, other responses");
    assert_ne!(a[0], a[1], "the n samples of a prompt differ");
}

#[test]
fn top_k_one_and_tiny_top_p_are_greedy() {
    let m = tiny();
    let prompts = vec![vec![5i64, 6, 7], vec![8i64]];
    let greedy = responses(&m, &prompts, &SamplingParams::greedy(8));
    let k1 = responses(
        &m,
        &prompts,
        &SamplingParams {
            max_new_tokens: 8,
            top_k: 1,
            seed: 5,
            ..SamplingParams::default()
        },
    );
    let p0 = responses(
        &m,
        &prompts,
        &SamplingParams {
            max_new_tokens: 8,
            top_p: 1e-6,
            seed: 6,
            ..SamplingParams::default()
        },
    );
    assert_eq!(greedy, k1);
    assert_eq!(greedy, p0);
}

#[test]
fn filters_keep_the_right_tokens() {
    let logits = Tensor::from_slice(&[1.0f32, 3.0, 2.0, 0.0, -1.0]).view([1, 5]);
    let k = top_k_filter(&logits, 2);
    let kept: Vec<bool> = Vec::try_from(k.isfinite().view([-1])).unwrap();
    assert_eq!(kept, vec![false, true, true, false, false]);
    // softmax = [0.0861, 0.6364, 0.2341, 0.0317, 0.0117]; ascending cumulative
    // 0.0117, 0.0434, 0.1295, 0.3636, 1.0: top_p 0.8 removes the tokens with cum <= 0.2.
    let p = top_p_filter(&logits, 0.8);
    let kept: Vec<bool> = Vec::try_from(p.isfinite().view([-1])).unwrap();
    assert_eq!(kept, vec![false, true, true, false, false]);
}

#[test]
fn sampling_frequencies_follow_probabilities() {
    let probs = Tensor::from_slice(&[0.5f32, 0.0, 0.3, 0.2])
        .view([1, 4])
        .repeat([4000, 1]);
    let mut rngs: Vec<Rng> = (0..4000).map(|i| Rng::derive(7, i)).collect();
    let draws: Vec<i64> = Vec::try_from(sample(&probs, &mut rngs)).unwrap();
    let count = |t: i64| draws.iter().filter(|&&d| d == t).count() as f64 / 4000.0;
    assert_eq!(count(1), 0.0, "zero-probability token never drawn");
    for (t, p) in [(0, 0.5), (2, 0.3), (3, 0.2)] {
        assert!(
            (count(t) - p).abs() < 0.03,
            "token {t}: {} vs {p}",
            count(t)
        );
    }
}

/// Random logits with a wide spread (some tokens far below the rest), a vocabulary that is not
/// a multiple of the head's block size, and rows that prefer different tokens.
fn head_case(vocab: i64, rows: i64) -> (Tensor, Tensor) {
    tch::manual_seed(11);
    let weight = Tensor::randn([vocab, 32], (Kind::Float, Device::Cpu)) * 0.8;
    let hidden = Tensor::randn([rows, 32], (Kind::Float, Device::Cpu)) * 1.5;
    (weight, hidden)
}

fn draws(head_logits: &HeadLogits, params: &SamplingParams, seed: u64) -> (Vec<i64>, Vec<f32>) {
    let n = 300;
    let mut rngs: Vec<Rng> = (0..n).map(|i| Rng::derive(seed, i)).collect();
    let u = uniforms(&mut rngs, 1, Device::Cpu).squeeze_dim(1);
    let (t, l) = head_logits.next_tokens(params, &u);
    (Vec::try_from(t).unwrap(), Vec::try_from(l).unwrap())
}

#[test]
fn vocabulary_major_head_draws_what_the_row_major_softmax_draws() {
    let (weight, hidden) = head_case(5000, 300);
    for params in [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.6,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 1.7,
            ..SamplingParams::default()
        },
        SamplingParams::greedy(1),
    ] {
        let mut fast = DecodeHead::for_weight(&weight, &params);
        assert!(fast.is_vocab_major());
        let reference = HeadLogits::RowMajor(hidden.matmul(&weight.tr()));
        // The buffer is reused from call to call: a second call must give the same answer.
        let _ = fast.logits(&(&hidden * 0.5));
        let (tokens, logp) = draws(&fast.logits(&hidden), &params, 3);
        let (want_tokens, want_logp) = draws(&reference, &params, 3);
        assert_eq!(
            tokens, want_tokens,
            "same uniforms, same tokens ({params:?})"
        );
        for (a, b) in logp.iter().zip(&want_logp) {
            assert!((a - b).abs() < 2e-5, "log-prob {a} vs {b} ({params:?})");
        }
        let distinct: std::collections::BTreeSet<i64> = tokens.iter().copied().collect();
        assert!(
            params.is_greedy() || distinct.len() > 100,
            "draws spread over the vocabulary"
        );
    }
}

#[test]
fn vocabulary_major_head_never_draws_a_token_without_mass() {
    // Every row's mass sits on three tokens of the last, partial block; all other logits are
    // 200 below them, so their probabilities (and whole blocks' masses) underflow to 0 in f32.
    let (vocab, rows) = (4100i64, 64i64);
    let weight = Tensor::zeros([vocab, 2], (Kind::Float, Device::Cpu));
    let _ = weight.narrow(1, 1, 1).fill_(-1.0);
    let _ = weight.narrow(0, 4090, 3).narrow(1, 0, 1).fill_(1.0);
    let _ = weight.narrow(0, 4090, 3).narrow(1, 1, 1).fill_(0.0);
    let hidden = Tensor::from_slice(&[1.0f32, 200.0])
        .view([1, 2])
        .repeat([rows, 1]);
    let params = SamplingParams::default();
    let mut head = DecodeHead::for_weight(&weight, &params);
    let logits = head.logits(&hidden);
    let mut rngs: Vec<Rng> = (0..rows as u64).map(|i| Rng::derive(5, i)).collect();
    let u = uniforms(&mut rngs, 1, Device::Cpu).squeeze_dim(1);
    let (tokens, logp) = logits.next_tokens(&params, &u);
    let tokens: Vec<i64> = Vec::try_from(tokens).unwrap();
    assert!(
        tokens.iter().all(|t| (4090..4093).contains(t)),
        "{tokens:?}"
    );
    for l in Vec::<f32>::try_from(logp).unwrap() {
        assert!((l - (1.0f32 / 3.0).ln()).abs() < 1e-5, "{l}");
    }
}

#[test]
fn generation_with_the_vocabulary_major_head_matches_the_row_major_one() {
    // top_p just below 1 sends the same model down the row-major path; it removes only tokens
    // whose cumulative probability is below 1e-9 (none carry that little mass here), so the
    // distribution, the uniforms and hence the tokens are the same.
    let m = tiny();
    let prompts = vec![vec![5i64, 6, 7], vec![8i64], vec![9i64, 10]];
    let fast = SamplingParams {
        max_new_tokens: 12,
        n: 3,
        seed: 8,
        temperature: 0.9,
        ..SamplingParams::default()
    };
    let slow = SamplingParams {
        top_p: 1.0 - 1e-9,
        ..fast.clone()
    };
    assert!(DecodeHead::new(&m, &fast).is_vocab_major());
    assert!(!DecodeHead::new(&m, &slow).is_vocab_major());
    assert_eq!(
        responses(&m, &prompts, &fast),
        responses(&m, &prompts, &slow)
    );
}

/// A head whose masked rows would win every draw: rows `a` and `b` are `+c·u` and `-c·u` for
/// one random direction `u`, so for every hidden state one of them has a logit of `c·|h·u|`,
/// far above the rest.
fn head_with_winners(vocab: i64, rows: i64, winners: &[(i64, i64)]) -> (Tensor, Tensor) {
    let (weight, hidden) = head_case(vocab, rows);
    let u = Tensor::randn([32], (Kind::Float, Device::Cpu));
    for &(a, b) in winners {
        weight.get(a).copy_(&(&u * 40.0));
        weight.get(b).copy_(&(&u * -40.0));
    }
    (weight, hidden)
}

#[test]
fn masked_tokens_are_never_drawn_and_leave_the_log_probs_normaliser() {
    use verlc_runtime::rollout::MaskedTokens;
    let vocab = 5000;
    // Single ids in the first and second blocks, and a tail of ten ids from 4990.
    let masked = MaskedTokens {
        from: Some(4990),
        ids: vec![2100, 17, 17],
    };
    let (weight, hidden) = head_with_winners(vocab, 300, &[(17, 2100), (4990, 4999)]);
    let banned = |t: i64| t == 17 || t == 2100 || t >= 4990;
    let logits = hidden.matmul(&weight.tr());
    for base in [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.6,
            ..SamplingParams::default()
        },
        SamplingParams::greedy(1),
        SamplingParams {
            top_k: 50,
            top_p: 0.9,
            ..SamplingParams::default()
        },
    ] {
        // Unmasked, the winners take nearly every draw: the test can tell.
        let (free, _) = draws(&HeadLogits::RowMajor(logits.shallow_clone()), &base, 3);
        let taken = free.iter().filter(|&&t| banned(t)).count();
        assert!(
            taken > 250,
            "{taken} of 300 unmasked draws hit the masked tokens"
        );

        let params = SamplingParams {
            masked: masked.clone(),
            ..base.clone()
        };
        let (tokens, logp) = draws(&HeadLogits::RowMajor(logits.shallow_clone()), &params, 3);
        assert!(!tokens.iter().any(|&t| banned(t)), "{params:?}: {tokens:?}");
        // The log-probs of the allowed tokens alone, at the sampling temperature.
        let keep: Vec<bool> = (0..vocab).map(|t| !banned(t)).collect();
        let keep = Tensor::from_slice(&keep).view([1, vocab]);
        let t = if params.is_greedy() {
            1.0
        } else {
            params.temperature
        };
        let want = (&logits / t)
            .masked_fill(&keep.logical_not(), f64::NEG_INFINITY)
            .log_softmax(-1, Kind::Float)
            .gather(-1, &Tensor::from_slice(&tokens).unsqueeze(-1), false)
            .squeeze_dim(-1);
        for (a, b) in logp.iter().zip(Vec::<f32>::try_from(want).unwrap()) {
            assert!((a - b).abs() < 2e-5, "{params:?}: log-prob {a} vs {b}");
        }
        // The vocabulary-major head, where the settings allow it, draws the same.
        let mut fast = DecodeHead::for_weight(&weight, &params);
        if fast.is_vocab_major() {
            let (fast_tokens, fast_logp) = draws(&fast.logits(&hidden), &params, 3);
            assert_eq!(fast_tokens, tokens, "{params:?}");
            for (a, b) in fast_logp.iter().zip(&logp) {
                assert!((a - b).abs() < 2e-5, "{params:?}: log-prob {a} vs {b}");
            }
        } else {
            assert!(params.top_k > 0);
        }
    }
}

#[test]
fn a_policy_masks_its_vocabulary_padding_and_its_vision_placeholders() {
    use verlc_runtime::rollout::sampling::masked_tokens;
    let text = from_pretrained("builtin://tiny", Device::Cpu, Dtype::Fp32, 0).unwrap();
    let vocab = text.config.vocab_size;
    let m = masked_tokens(&text.config, vocab as usize);
    assert!(m.is_empty_for(vocab), "{m:?}");
    // A checkpoint's rows past its tokenizer's ids.
    let m = masked_tokens(&text.config, vocab as usize - 7);
    assert_eq!((m.from, m.ids.as_slice()), (Some(vocab - 7), &[][..]));

    let vl = from_pretrained(
        "builtin://tiny?arch=qwen2_5_vl",
        Device::Cpu,
        Dtype::Fp32,
        0,
    )
    .unwrap();
    let tokens = verlc_runtime::model::vision::Vision::tokens_of(&vl.config).unwrap();
    let m = masked_tokens(&vl.config, vl.config.vocab_size as usize);
    assert_eq!(m.from, None);
    assert_eq!(m.ids, vec![tokens.image_token_id, tokens.video_token_id]);
}
