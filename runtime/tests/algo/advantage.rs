//! Advantage estimators: the oracle batch, hand-derived cases and properties.
use tch::{Kind, Tensor};
use verlc_runtime::algo::AlgoRelease;
use verlc_runtime::algo::advantage::{self, gae, gpg, grpo, grpo_passk, opo, rloo};
use verlc_runtime::algo::{
    AdvEstimator, AdvantageConfig, AdvantageInputs, AlgoError, GroupIndex, compute_advantage,
};

use crate::oracle;
use crate::support::{assert_close, assert_near, rng_lock, t1, t2, to_vec};

const TOL: f64 = 1e-9;

fn index_of(meta: &serde_json::Value, key: &str) -> GroupIndex {
    let ids: Vec<i64> = meta[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    GroupIndex::from_ids(&ids)
}

/// Runs `est` on the oracle batch with the dense (`"dense"`) or outcome (`"outcome"`) rewards.
fn run(est: AdvEstimator, rewards: &str, norm: bool) -> advantage::Advantages {
    let o = oracle::load("adv");
    let index = index_of(
        &o.meta,
        if est == AdvEstimator::GrpoPassk {
            "index_k2"
        } else {
            "index"
        },
    );
    let r = o.get(if rewards == "dense" {
        "rewards"
    } else {
        "outcome"
    });
    let inputs = AdvantageInputs::new(r, o.get("mask"))
        .values(o.get("values"))
        .index(&index)
        .reward_baselines(o.get("baselines"));
    let gamma = if est == AdvEstimator::ReinforcePlusPlus {
        o.meta["rfpp_gamma"].as_f64().unwrap()
    } else {
        o.meta["gamma"].as_f64().unwrap()
    };
    // The oracle writes the 0.7 forms (reinforce_plus_plus's restarting returns, the floored
    // grpo_vectorized std); each release's own forms are release_semantics.rs's.
    let cfg = AdvantageConfig {
        gamma,
        lam: o.meta["lam"].as_f64().unwrap(),
        norm_adv_by_std_in_grpo: norm,
        epsilon: 1e-6,
        release: verlc_runtime::algo::AlgoRelease::V0_7_0,
    };
    compute_advantage(est, &inputs, &cfg).unwrap()
}

/// Estimators whose returns equal their advantages, compared for both reward kinds.
fn check_outcome(est: AdvEstimator, key: impl Fn(&str) -> String, norm: bool) {
    let o = oracle::load("adv");
    for rewards in ["dense", "outcome"] {
        let out = run(est, rewards, norm);
        let want = o.get(&key(rewards));
        assert_close(
            &out.advantages,
            want,
            TOL,
            &format!("{est} {rewards} advantages"),
        );
        assert_close(&out.returns, want, TOL, &format!("{est} {rewards} returns"));
    }
}

#[test]
fn gae_matches_oracle() {
    let o = oracle::load("adv");
    let out = run(AdvEstimator::Gae, "dense", true);
    assert_close(&out.advantages, o.get("gae/adv"), TOL, "gae advantages");
    assert_close(&out.returns, o.get("gae/ret"), TOL, "gae returns");
}

#[test]
fn grpo_matches_oracle() {
    for norm in [true, false] {
        check_outcome(
            AdvEstimator::Grpo,
            |r| format!("grpo/{r}/{}", py_bool(norm)),
            norm,
        );
    }
}

#[test]
fn grpo_vectorized_matches_oracle() {
    for norm in [true, false] {
        check_outcome(
            AdvEstimator::GrpoVectorized,
            |r| format!("grpo_vectorized/{r}/{}", py_bool(norm)),
            norm,
        );
    }
}

#[test]
fn grpo_passk_matches_oracle() {
    for norm in [true, false] {
        check_outcome(
            AdvEstimator::GrpoPassk,
            |r| format!("grpo_passk/{r}/{}", py_bool(norm)),
            norm,
        );
    }
}

#[test]
fn rloo_matches_oracle() {
    check_outcome(AdvEstimator::Rloo, |r| format!("rloo/{r}"), true);
}

#[test]
fn rloo_vectorized_matches_oracle() {
    check_outcome(
        AdvEstimator::RlooVectorized,
        |r| format!("rloo_vectorized/{r}"),
        true,
    );
}

#[test]
fn opo_matches_oracle() {
    check_outcome(AdvEstimator::Opo, |r| format!("opo/{r}"), true);
}

#[test]
fn gpg_matches_oracle() {
    check_outcome(AdvEstimator::Gpg, |r| format!("gpg/{r}"), true);
}

#[test]
fn reinforce_plus_plus_baseline_matches_oracle() {
    check_outcome(
        AdvEstimator::ReinforcePlusPlusBaseline,
        |r| format!("reinforce_plus_plus_baseline/{r}"),
        true,
    );
}

#[test]
fn reinforce_plus_plus_matches_oracle() {
    let o = oracle::load("adv");
    for rewards in ["dense", "outcome"] {
        let out = run(AdvEstimator::ReinforcePlusPlus, rewards, true);
        assert_close(
            &out.advantages,
            o.get(&format!("reinforce_plus_plus/{rewards}/adv")),
            TOL,
            "rf++ advantages",
        );
        assert_close(
            &out.returns,
            o.get(&format!("reinforce_plus_plus/{rewards}/ret")),
            TOL,
            "rf++ returns",
        );
    }
}

#[test]
fn remax_matches_oracle() {
    let o = oracle::load("adv");
    for rewards in ["dense", "outcome"] {
        let out = run(AdvEstimator::Remax, rewards, true);
        assert_close(
            &out.advantages,
            o.get(&format!("remax/{rewards}/adv")),
            TOL,
            "remax advantages",
        );
        assert_close(
            &out.returns,
            o.get(&format!("remax/{rewards}/ret")),
            TOL,
            "remax returns",
        );
    }
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

// ---- hand-derived cases ------------------------------------------------------------------------

#[test]
fn grpo_hand_derived() {
    // One group, scores s = [1, 0, 1, 0] (reward on the last valid token).
    // μ = 0.5; unbiased σ = sqrt(4·0.25/3) = sqrt(1/3) = 0.5773502692.
    // A = ±0.5/(σ + 1e-6) = ±0.8660239...; without std: ±0.5. Broadcast over the mask.
    let r = t2(&[&[0.0, 1.0], &[0.0, 0.0], &[1.0, 0.0], &[0.0, 0.0]]);
    let m = t2(&[&[1.0, 1.0], &[1.0, 1.0], &[1.0, 0.0], &[1.0, 1.0]]);
    let ix = GroupIndex::from_ids(&[7, 7, 7, 7]);
    let a = 0.5 / ((1.0f64 / 3.0).sqrt() + 1e-6);
    let out = grpo::compute(&r, &m, &ix, true, 1e-6).unwrap();
    let want = t2(&[&[a, a], &[-a, -a], &[a, 0.0], &[-a, -a]]);
    assert_close(&out.advantages, &want, 1e-12, "grpo");
    let out = grpo::compute(&r, &m, &ix, false, 1e-6).unwrap();
    let want = t2(&[&[0.5, 0.5], &[-0.5, -0.5], &[0.5, 0.0], &[-0.5, -0.5]]);
    assert_close(&out.advantages, &want, 1e-12, "dr. grpo");
}

#[test]
fn grpo_singleton_and_constant_groups() {
    // Singleton: μ = 0, σ = 1 → A = s/(1 + 1e-6). Constant group {2, 2}: σ = 0 → A = 0/(0 + ε) = 0.
    // grpo_vectorized floors the variance at ε: σ = sqrt(1e-6) = 1e-3, still A = 0.
    let scores = [3.0, 2.0, 2.0];
    let ix = GroupIndex::from_ids(&[0, 1, 1]);
    let a = grpo::advantages(&scores, &ix, true, 1e-6);
    assert_near(a[0], 3.0 / (1.0 + 1e-6), 1e-15, "singleton");
    assert_eq!(&a[1..], &[0.0, 0.0]);
    let v = grpo::advantages_vectorized(&scores, &ix, true, 1e-6, AlgoRelease::V0_7_0);
    assert_near(v[0], 3.0 / (1.0 + 1e-6), 1e-15, "singleton (vectorized)");
    assert_eq!(&v[1..], &[0.0, 0.0]);
    // Where the one-pass variance is below ε verl 0.7's floor changes the result:
    // {0, 1e-4}: var = 5e-9 < 1e-6 → σ = 1e-3; A = ±5e-5/(1e-3 + 1e-6) = ±0.04995...
    let pair = GroupIndex::from_ids(&[0, 0]);
    let v = grpo::advantages_vectorized(&[0.0, 1e-4], &pair, true, 1e-6, AlgoRelease::V0_7_0);
    assert_near(v[1], 5e-5 / (1e-3 + 1e-6), 1e-6, "variance floor");
    // verl 0.8 on: no floor, σ = sqrt(5e-9) ≈ 7.07e-5; A = 5e-5/(7.07e-5 + 1e-6) ≈ 0.6972.
    let v = grpo::advantages_vectorized(&[0.0, 1e-4], &pair, true, 1e-6, AlgoRelease::NEWEST);
    assert_near(v[1], 5e-5 / (5e-9f64.sqrt() + 1e-6), 1e-9, "no floor");
}

#[test]
fn rloo_hand_derived() {
    // Group {1, 2, 6}: A_i = s_i − mean of the others: 1 − 4 = −3, 2 − 3.5 = −1.5, 6 − 1.5 = 4.5.
    // Singleton {5}: rloo keeps the score (5), rloo_vectorized gives 0.
    let scores = [1.0, 2.0, 5.0, 6.0];
    let ix = GroupIndex::from_ids(&[0, 0, 1, 0]);
    let a = rloo::advantages(&scores, &ix);
    for (g, w) in a.iter().zip([-3.0, -1.5, 5.0, 4.5]) {
        assert_near(*g, w, 1e-12, "rloo");
    }
    let v = rloo::advantages_vectorized(&scores, &ix);
    for (g, w) in v.iter().zip([-3.0, -1.5, 0.0, 4.5]) {
        assert_near(*g, w, 1e-12, "rloo_vectorized");
    }
}

#[test]
fn opo_hand_derived() {
    // Group {s = 1 (length 3), s = 0 (length 1)}: b = (3·1 + 1·0)/(3 + 1) = 0.75; A = [0.25, −0.75].
    let r = t2(&[&[0.0, 0.0, 1.0], &[0.0, 0.0, 0.0]]);
    let m = t2(&[&[1.0, 1.0, 1.0], &[1.0, 0.0, 0.0]]);
    let out = opo::compute(&r, &m, &GroupIndex::from_ids(&[0, 0])).unwrap();
    assert_close(
        &out.advantages,
        &t2(&[&[0.25, 0.25, 0.25], &[-0.75, 0.0, 0.0]]),
        1e-12,
        "opo",
    );
}

#[test]
fn gpg_hand_derived() {
    // Scores [1, 0, 0, 1] in groups {0,1} and {2,3}: 2 non-zero of B = 4 → α = 2; both group means
    // are 0.5, so A = 2·(s − 0.5) = [1, −1, −1, 1].
    let a = gpg::advantages(&[1.0, 0.0, 0.0, 1.0], &GroupIndex::from_ids(&[0, 0, 1, 1]));
    assert_eq!(a, vec![1.0, -1.0, -1.0, 1.0]);
    // All scores zero: α = B / max(1, 0) = B, advantages 0.
    assert_eq!(
        gpg::advantages(&[0.0, 0.0], &GroupIndex::from_ids(&[0, 0])),
        vec![0.0, 0.0]
    );
}

#[test]
fn grpo_passk_hand_derived() {
    // Group {0.2, 0.9, 0.5}: best is sample 1, gap 0.9 − 0.5 = 0.4. Unbiased σ: mean 0.5333…,
    // squared deviations 0.11111 + 0.13444 + 0.00111 = 0.246667, /2 = 0.123333, σ = 0.3511885.
    // A_1 = 0.4/(σ + 1e-6) = 1.1389864; the others 0.
    let scores = [0.2, 0.9, 0.5];
    let ix = GroupIndex::from_ids(&[4, 4, 4]);
    let a = grpo_passk::advantages(&scores, &ix, true, 1e-6).unwrap();
    assert_near(
        a[1],
        0.4 / (0.123333333333333_f64.sqrt() + 1e-6),
        1e-9,
        "pass@k",
    );
    assert_near(a[1], 1.1389864, 1e-7, "pass@k (literal)");
    assert_eq!((a[0], a[2]), (0.0, 0.0));
    let a = grpo_passk::advantages(&scores, &ix, false, 1e-6).unwrap();
    assert_near(a[1], 0.4, 1e-12, "pass@k unnormalised");
    // Ties at the maximum: gap 0, every advantage 0.
    let a = grpo_passk::advantages(
        &[1.0, 1.0, 0.0],
        &GroupIndex::from_ids(&[0, 0, 0]),
        true,
        1e-6,
    )
    .unwrap();
    assert_eq!(a, vec![0.0, 0.0, 0.0]);
}

#[test]
fn grpo_passk_rejects_singleton_groups() {
    let err = grpo_passk::advantages(
        &[1.0, 0.0, 2.0],
        &GroupIndex::from_ids(&[0, 0, 1]),
        true,
        1e-6,
    )
    .unwrap_err();
    assert!(err.to_string().contains("at least 2 samples"), "{err}");
}

#[test]
fn remax_hand_derived() {
    // r = [0, 1, 2], m = [1, 1, 0], b = 0.5: r·m = [0, 1, 0], G = reverse cumsum = [1, 1, 0];
    // A = G − b·m = [0.5, 0.5, 0].
    let out = advantage::remax::compute(
        &t2(&[&[0.0, 1.0, 2.0]]),
        &t1(&[0.5]),
        &t2(&[&[1.0, 1.0, 0.0]]),
    )
    .unwrap();
    assert_close(
        &out.returns,
        &t2(&[&[1.0, 1.0, 0.0]]),
        1e-12,
        "remax returns",
    );
    assert_close(
        &out.advantages,
        &t2(&[&[0.5, 0.5, 0.0]]),
        1e-12,
        "remax advantages",
    );
}

#[test]
fn reinforce_plus_plus_resets_after_eos() {
    // r = [1, 1, 1, 5], m = [1, 1, 1, 0], γ = 0.5. G_3 = 5 (the padding's own return), then the
    // running return is multiplied by m_3 = 0, so G_2 = 1, G_1 = 1 + 0.5 = 1.5,
    // G_0 = 1 + 0.75 = 1.75: the reward after EOS does not leak backwards.
    let r = t2(&[&[1.0, 1.0, 1.0, 5.0], &[0.0, 0.0, 1.0, 0.0]]);
    let m = t2(&[&[1.0, 1.0, 1.0, 0.0], &[1.0, 1.0, 1.0, 1.0]]);
    let old =
        advantage::reinforce_pp::compute(&r, &m, 0.5, verlc_runtime::algo::AlgoRelease::V0_7_0)
            .unwrap();
    assert_eq!(&to_vec(&old.returns)[..4], &[1.75, 1.5, 1.0, 5.0]);
    // verl 0.9 masks the returns too: the padding's own return is 0.
    let out =
        advantage::reinforce_pp::compute(&r, &m, 0.5, verlc_runtime::algo::AlgoRelease::NEWEST)
            .unwrap();
    let g = to_vec(&out.returns);
    assert_eq!(&g[..4], &[1.75, 1.5, 1.0, 0.0]);
    // Advantages are whitened over the valid tokens and zero elsewhere.
    let a = to_vec(&out.advantages);
    assert_eq!(a[3], 0.0);
    let valid: Vec<f64> = a
        .iter()
        .zip(to_vec(&m))
        .filter(|(_, m)| *m > 0.0)
        .map(|(a, _)| *a)
        .collect();
    assert_masked_standardised(&valid);
}

// ---- properties --------------------------------------------------------------------------------

/// Mean 0 and unbiased variance 1 (up to the 1e-8 epsilons of the masked mean and variance).
fn assert_masked_standardised(xs: &[f64]) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    assert!(mean.abs() < 1e-7, "mean {mean}");
    assert!((var - 1.0).abs() < 1e-6, "variance {var}");
}

/// A seeded batch: 8 groups of 1..=8 responses with random scores.
fn random_groups(seed: i64) -> (Tensor, Tensor, GroupIndex, Vec<i64>) {
    let _rng = rng_lock();
    tch::manual_seed(seed);
    let ids: Vec<i64> = (0..8)
        .flat_map(|g| std::iter::repeat_n(g, g as usize + 1))
        .collect();
    let b = ids.len() as i64;
    let rewards = Tensor::randn([b, 5], (Kind::Double, tch::Device::Cpu));
    let lengths = Tensor::randint_low(1, 6, [b, 1], (Kind::Int64, tch::Device::Cpu));
    let mask = Tensor::arange(5, (Kind::Int64, tch::Device::Cpu))
        .unsqueeze(0)
        .lt_tensor(&lengths)
        .to_kind(Kind::Double);
    (rewards, mask, GroupIndex::from_ids(&ids), ids)
}

/// The per-sequence advantage: the value at the first token (every response has one).
fn first_token(t: &Tensor) -> Vec<f64> {
    to_vec(&t.select(1, 0))
}

#[test]
fn grpo_advantages_have_zero_mean_and_unit_std_per_group() {
    let (r, m, ix, _) = random_groups(1);
    for est in [AdvEstimator::Grpo, AdvEstimator::GrpoVectorized] {
        let out = compute_advantage(
            est,
            &AdvantageInputs::new(&r, &m).index(&ix),
            &AdvantageConfig::default(),
        )
        .unwrap();
        let a = first_token(&out.advantages);
        for members in ix.groups().filter(|g| g.len() > 1) {
            let xs: Vec<f64> = members.iter().map(|&i| a[i]).collect();
            let k = xs.len() as f64;
            let mean = xs.iter().sum::<f64>() / k;
            let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1.0)).sqrt();
            assert!(mean.abs() < 1e-12, "{est}: group mean {mean}");
            assert!((std - 1.0).abs() < 1e-4, "{est}: group std {std}");
        }
        // Without the std: zero mean, the scale of the scores kept.
        let cfg = AdvantageConfig {
            norm_adv_by_std_in_grpo: false,
            ..AdvantageConfig::default()
        };
        let out = compute_advantage(est, &AdvantageInputs::new(&r, &m).index(&ix), &cfg).unwrap();
        let a = first_token(&out.advantages);
        let s = to_vec(&r.sum_dim_intlist(-1i64, false, Kind::Double));
        for members in ix.groups().filter(|g| g.len() > 1) {
            let mean: f64 = members.iter().map(|&i| a[i]).sum::<f64>();
            assert!(mean.abs() < 1e-12, "{est}: Dr. GRPO group sum {mean}");
            let (i, j) = (members[0], members[1]);
            assert_near(a[i] - a[j], s[i] - s[j], 1e-12, "differences kept");
        }
    }
}

#[test]
fn grpo_vectorized_equals_grpo_when_variance_exceeds_epsilon() {
    let (r, m, ix, _) = random_groups(2);
    let ins = AdvantageInputs::new(&r, &m).index(&ix);
    let cfg = AdvantageConfig::default();
    let a = compute_advantage(AdvEstimator::Grpo, &ins, &cfg).unwrap();
    let b = compute_advantage(AdvEstimator::GrpoVectorized, &ins, &cfg).unwrap();
    assert_close(
        &a.advantages,
        &b.advantages,
        1e-9,
        "grpo vs grpo_vectorized",
    );
}

#[test]
fn rloo_uses_leave_one_out_baselines() {
    let (r, m, ix, _) = random_groups(3);
    let s = to_vec(&r.sum_dim_intlist(-1i64, false, Kind::Double));
    let a = first_token(&rloo::compute(&r, &m, &ix).unwrap().advantages);
    let v = first_token(&rloo::compute_vectorized(&r, &m, &ix).unwrap().advantages);
    for members in ix.groups() {
        for &i in members {
            if members.len() == 1 {
                assert_near(a[i], s[i], 1e-12, "singleton rloo");
                assert_eq!(v[i], 0.0, "singleton rloo_vectorized");
                continue;
            }
            let others: Vec<f64> = members.iter().filter(|&&j| j != i).map(|&j| s[j]).collect();
            let baseline = others.iter().sum::<f64>() / others.len() as f64;
            assert_near(a[i], s[i] - baseline, 1e-12, "rloo");
            assert_near(v[i], s[i] - baseline, 1e-12, "rloo_vectorized");
        }
    }
}

#[test]
fn grpo_passk_rewards_only_the_best_of_each_group() {
    let (r, m, _, ids) = random_groups(4);
    // Merge the singleton group 0 into group 1 (pass@k needs K ≥ 2).
    let ids: Vec<i64> = ids.iter().map(|&g| g.max(1)).collect();
    let ix = GroupIndex::from_ids(&ids);
    let s = to_vec(&r.sum_dim_intlist(-1i64, false, Kind::Double));
    let a = first_token(
        &grpo_passk::compute(&r, &m, &ix, false, 1e-6)
            .unwrap()
            .advantages,
    );
    for members in ix.groups() {
        let mut sorted: Vec<f64> = members.iter().map(|&i| s[i]).collect();
        sorted.sort_by(|x, y| y.total_cmp(x));
        let nonzero: Vec<usize> = members.iter().copied().filter(|&i| a[i] != 0.0).collect();
        assert_eq!(nonzero.len(), 1);
        assert_eq!(s[nonzero[0]], sorted[0], "the best response");
        assert_near(
            a[nonzero[0]],
            sorted[0] - sorted[1],
            1e-12,
            "gap to the second best",
        );
    }
}

#[test]
fn gae_with_lambda_one_equals_discounted_sum() {
    // λ = 1: Â_t = Σ_k γ^k r_{t+k} − V_t, so returns = Â + V are the discounted reward-to-go,
    // whatever the values.
    let _rng = rng_lock();
    tch::manual_seed(5);
    let (b, l, gamma) = (3, 6, 0.9);
    let r = Tensor::randn([b, l], (Kind::Double, tch::Device::Cpu));
    let v = Tensor::randn([b, l], (Kind::Double, tch::Device::Cpu));
    let m = Tensor::ones([b, l], (Kind::Double, tch::Device::Cpu));
    let out = gae::compute(&r, &v, &m, gamma, 1.0).unwrap();
    let rv = to_vec(&r);
    let mut want = vec![0.0; (b * l) as usize];
    for i in 0..b as usize {
        for t in 0..l as usize {
            want[i * l as usize + t] = (t..l as usize)
                .map(|k| gamma.powi((k - t) as i32) * rv[i * l as usize + k])
                .sum();
        }
    }
    assert_close(
        &out.returns,
        &Tensor::from_slice(&want).view([b, l]),
        1e-12,
        "returns",
    );
    // The advantages are the whitened Â.
    let raw = &out.returns - &v;
    let mean = raw.mean(Kind::Double);
    let std = raw.std(true);
    assert_close(
        &out.advantages,
        &((&raw - &mean) / (std.square() + 1e-8).sqrt()),
        1e-7,
        "whitened",
    );
}

#[test]
fn gae_skips_masked_tokens() {
    // γ = λ = 1. Token 1 is a tool/observation token (m = 0): its reward and value are skipped and
    // V_next/Â_next are carried through, so with V = 0 the returns at valid tokens are the sums of
    // the valid rewards from t on: r = [1, 10, 2, 3] → G = [1 + 2 + 3, ·, 2 + 3, 3] = [6, ·, 5, 3].
    // At the masked token Â is the carried Â of token 2 (5).
    let r = t2(&[&[1.0, 10.0, 2.0, 3.0]]);
    let v = t2(&[&[0.0, 0.0, 0.0, 0.0]]);
    let m = t2(&[&[1.0, 0.0, 1.0, 1.0]]);
    let out = gae::compute(&r, &v, &m, 1.0, 1.0).unwrap();
    assert_eq!(to_vec(&out.returns), vec![6.0, 5.0, 5.0, 3.0]);
    // With values, δ at valid tokens uses the next *valid* value: V = [0.5, 100, 1, 2],
    // Â_3 = 3 − 2 = 1; Â_2 = 2 + 2 − 1 + 1 = 4; Â_0 = 1 + 1 − 0.5 + 4 = 5.5 → returns [6, ·, 5, 3].
    let v = t2(&[&[0.5, 100.0, 1.0, 2.0]]);
    let out = gae::compute(&r, &v, &m, 1.0, 1.0).unwrap();
    let ret = to_vec(&out.returns);
    assert_eq!((ret[0], ret[2], ret[3]), (6.0, 5.0, 3.0));
}

#[test]
fn whitened_estimators_are_standardised_over_the_mask() {
    let (r, m, ix, _) = random_groups(6);
    let v = {
        let _rng = rng_lock();
        Tensor::randn(r.size(), (Kind::Double, tch::Device::Cpu))
    };
    let cfg = AdvantageConfig {
        gamma: 0.97,
        lam: 0.95,
        ..AdvantageConfig::default()
    };
    for est in [
        AdvEstimator::Gae,
        AdvEstimator::ReinforcePlusPlus,
        AdvEstimator::ReinforcePlusPlusBaseline,
    ] {
        let out = compute_advantage(
            est,
            &AdvantageInputs::new(&r, &m).values(&v).index(&ix),
            &cfg,
        )
        .unwrap();
        let valid: Vec<f64> = to_vec(&out.advantages)
            .into_iter()
            .zip(to_vec(&m))
            .filter(|(_, m)| *m > 0.0)
            .map(|(a, _)| a)
            .collect();
        assert_masked_standardised(&valid);
    }
}

#[test]
fn outputs_keep_kind_and_device() {
    let r = t2(&[&[0.0, 1.0], &[1.0, 0.0]]).to_kind(Kind::Float);
    let m = Tensor::ones([2, 2], (Kind::Bool, tch::Device::Cpu));
    let ix = GroupIndex::from_labels(&["a", "a"]);
    let out = compute_advantage(
        AdvEstimator::Grpo,
        &AdvantageInputs::new(&r, &m).index(&ix),
        &AdvantageConfig::default(),
    )
    .unwrap();
    assert_eq!(out.advantages.kind(), Kind::Float);
    assert_eq!(out.returns.device(), tch::Device::Cpu);
}

#[test]
fn bad_inputs_are_errors() {
    let r = t2(&[&[0.0, 1.0], &[1.0, 0.0]]);
    let m = t2(&[&[1.0, 1.0], &[1.0, 1.0]]);
    let cfg = AdvantageConfig::default();
    let err =
        compute_advantage(AdvEstimator::Grpo, &AdvantageInputs::new(&r, &m), &cfg).unwrap_err();
    assert!(
        matches!(
            err,
            AlgoError::MissingInput {
                input: "index (group ids)",
                ..
            }
        ),
        "{err}"
    );
    let err =
        compute_advantage(AdvEstimator::Gae, &AdvantageInputs::new(&r, &m), &cfg).unwrap_err();
    assert!(
        matches!(
            err,
            AlgoError::MissingInput {
                input: "values",
                ..
            }
        ),
        "{err}"
    );
    let err =
        compute_advantage(AdvEstimator::Remax, &AdvantageInputs::new(&r, &m), &cfg).unwrap_err();
    assert!(
        matches!(
            err,
            AlgoError::MissingInput {
                input: "reward_baselines",
                ..
            }
        ),
        "{err}"
    );
    let three = GroupIndex::from_ids(&[0, 0, 1]);
    let err = compute_advantage(
        AdvEstimator::Rloo,
        &AdvantageInputs::new(&r, &m).index(&three),
        &cfg,
    )
    .unwrap_err();
    assert!(
        matches!(err, AlgoError::Shape { name: "index", .. }),
        "{err}"
    );
    let short = t2(&[&[1.0], &[1.0]]);
    let err = compute_advantage(
        AdvEstimator::ReinforcePlusPlus,
        &AdvantageInputs::new(&r, &short),
        &cfg,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            AlgoError::Shape {
                name: "response_mask",
                ..
            }
        ),
        "{err}"
    );
    let err = compute_advantage(
        AdvEstimator::ReinforcePlusPlus,
        &AdvantageInputs::new(&t1(&[1.0]), &t1(&[1.0])),
        &cfg,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            AlgoError::Shape {
                name: "token_level_rewards",
                ..
            }
        ),
        "{err}"
    );
    let err = advantage::remax::compute(&r, &t1(&[0.0]), &m).unwrap_err();
    assert!(
        matches!(
            err,
            AlgoError::Shape {
                name: "reward_baselines",
                ..
            }
        ),
        "{err}"
    );
    // Whitening one valid token is an error (verl raises too), not a NaN.
    let one = t2(&[&[1.0, 0.0], &[0.0, 0.0]]);
    let err = compute_advantage(
        AdvEstimator::ReinforcePlusPlus,
        &AdvantageInputs::new(&r, &one),
        &cfg,
    )
    .unwrap_err();
    assert!(matches!(err, AlgoError::Data(_)), "{err}");
}

#[test]
fn group_index_from_labels_and_tensors() {
    let ix = GroupIndex::from_labels(&["u2", "u1", "u2", "u3"]);
    assert_eq!(ix.num_groups(), 3);
    assert_eq!(ix.members(0), &[0, 2]);
    assert_eq!(ix.size_of(3), 1);
    let t = GroupIndex::from_tensor(&Tensor::from_slice(&[5i64, 9, 5, 2])).unwrap();
    assert_eq!(t, ix);
    assert!(GroupIndex::from_tensor(&t1(&[1.0])).is_err());
}

/// verl 0.9's optimal token baselines (single- and multi-turn, with and without rollout IS
/// weights) and its variance-proxy metrics, equal to its own functions run from the 0.9.1 source
/// on groups of one to four with a strictly longest trajectory, tied longest ones, an empty
/// response and (multi-turn) masks with holes.
#[test]
fn optimal_token_baselines_are_verl_0_9s() {
    use verlc_runtime::algo::variance_proxy::{VarianceInputs, variance_proxy_metrics};
    let o = oracle::verl_functions("estimators_0_9");
    let m = |k: &str| crate::support::json_matrix(&o[k]);
    let ids: Vec<i64> = serde_json::from_value(o["index"].clone()).expect("index");
    let index = GroupIndex::from_ids(&ids);
    let (rewards, old, sq, w) = (
        m("rewards"),
        m("old_log_probs"),
        m("sum_pi_squared"),
        m("rollout_is_weights"),
    );
    let cases = o["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 4);
    for case in cases {
        let multi = case["form"] == "multi";
        let weighted = case["weighted"] == true;
        let what = format!("multi-turn={multi} weighted={weighted}");
        let mask = m(if multi { "holed_mask" } else { "mask" });
        let est = if multi {
            AdvEstimator::TirOptimalTokenBaseline
        } else {
            AdvEstimator::OptimalTokenBaseline
        };
        let mut inputs = AdvantageInputs::new(&rewards, &mask)
            .index(&index)
            .path_variance(&old, &sq);
        if weighted {
            inputs = inputs.rollout_is_weights(&w);
        }
        let out = compute_advantage(est, &inputs, &AdvantageConfig::default()).unwrap();
        // verl computes in f32.
        let want_adv = crate::support::json_matrix(&case["advantages"]);
        let want_ret = crate::support::json_matrix(&case["returns"]);
        let d = (&out.advantages - &want_adv).abs().max().double_value(&[]);
        let r = (&out.returns - &want_ret).abs().max().double_value(&[]);
        assert!(
            d < 1e-5 && r < 1e-6,
            "{what}: advantages differ by {d}, returns by {r}"
        );

        let x = VarianceInputs {
            old_log_probs: &old,
            sum_pi_squared: &sq,
            advantages: &out.advantages,
            response_mask: &mask,
            rollout_is_weights: weighted.then_some(&w),
        };
        let grad_norm = o["grad_norm"].as_f64();
        for (k, v) in variance_proxy_metrics(&x, grad_norm).unwrap() {
            let want = case["metrics"][k]
                .as_f64()
                .unwrap_or_else(|| panic!("{what}: no {k}"));
            assert!(
                (v - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{what}: {k} {v} vs verl {want}"
            );
        }
    }
    // Without Σπ² the estimator names what it misses.
    let mask = m("mask");
    let inputs = AdvantageInputs::new(&rewards, &mask).index(&index);
    let err = compute_advantage(
        AdvEstimator::OptimalTokenBaseline,
        &inputs,
        &AdvantageConfig::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("old_log_probs"), "{err}");
}

/// verl 0.9's `gdpo`: two reward components normalised per group, summed with and without
/// weights and whitened, equal to its own function (which places each component at the
/// response's last token from the attention mask); and its fallback on the token-level rewards.
#[test]
fn gdpo_is_verl_0_9s() {
    use verlc_runtime::algo::advantage::gdpo::Components;
    let o = oracle::verl_functions("estimators_0_9");
    let m = |k: &str| crate::support::json_matrix(&o[k]);
    let ids: Vec<i64> = serde_json::from_value(o["index"].clone()).expect("index");
    let index = GroupIndex::from_ids(&ids);
    let (rewards, mask) = (m("rewards"), m("mask"));
    let comps = &o["gdpo_components"];
    let scores: Vec<Tensor> = ["format_reward", "accuracy_reward"]
        .iter()
        .map(|k| {
            let v: Vec<f64> = serde_json::from_value(comps[*k].clone()).expect("component");
            Tensor::from_slice(&v)
        })
        .collect();
    let cases = o["gdpo_cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 3);
    let cfg = AdvantageConfig::default();
    for case in cases {
        let weights: Option<Vec<f64>> = serde_json::from_value(case["weights"].clone()).unwrap();
        let mut inputs = AdvantageInputs::new(&rewards, &mask).index(&index);
        if case["fallback"] != true {
            inputs = inputs.components(Components {
                scores: &scores,
                weights: weights.as_deref(),
            });
        }
        let out = compute_advantage(AdvEstimator::Gdpo, &inputs, &cfg).unwrap();
        let want = crate::support::json_matrix(&case["advantages"]);
        let d = (&out.advantages - &want).abs().max().double_value(&[]);
        assert!(d < 1e-5, "weights {weights:?}: advantages differ by {d}");
        assert_eq!(
            (&out.advantages - &out.returns)
                .abs()
                .max()
                .double_value(&[]),
            0.0
        );
    }
    // One weight for two keys is refused, not truncated.
    let inputs = AdvantageInputs::new(&rewards, &mask)
        .index(&index)
        .components(Components {
            scores: &scores,
            weights: Some(&[1.0]),
        });
    assert!(compute_advantage(AdvEstimator::Gdpo, &inputs, &cfg).is_err());
}
