//! Policy losses: value, gradient and metrics against the oracle for every mode × agg mode ×
//! (local/global) × (with/without rollout weights); hand-derived cases; properties.
use tch::{Kind, Tensor};
use verlc_runtime::algo::policy_loss::{self, clip_cov, kl_cov};
use verlc_runtime::algo::{
    AggOptions, AlgoError, LossAggMode, PolicyLossConfig, PolicyLossInputs, PolicyLossMode,
    compute_policy_loss,
};

use crate::oracle;
use crate::support::{assert_close, assert_near, leaf, rng_lock, scalar, t2, to_vec};

const MODES: [LossAggMode; 4] = [
    LossAggMode::TokenMean,
    LossAggMode::SeqMeanTokenSum,
    LossAggMode::SeqMeanTokenMean,
    LossAggMode::SeqMeanTokenSumNorm,
];

fn oracle_cfg(meta: &serde_json::Value) -> PolicyLossConfig {
    let c = &meta["cfg"];
    let f = |k: &str| c[k].as_f64().unwrap();
    PolicyLossConfig {
        clip_ratio: 0.2,
        clip_ratio_low: Some(f("clip_low")),
        clip_ratio_high: Some(f("clip_high")),
        clip_ratio_c: f("clip_c"),
        tau_pos: f("tau_pos"),
        tau_neg: f("tau_neg"),
        clip_cov_ratio: f("clip_cov_ratio"),
        clip_cov_lb: f("clip_cov_lb"),
        clip_cov_ub: f("clip_cov_ub"),
        kl_cov_ratio: f("kl_cov_ratio"),
        ppo_kl_coef: f("ppo_kl_coef"),
        dro_beta: Some(f("dro_beta")),
        release: verlc_runtime::algo::AlgoRelease::V0_7_0,
    }
}

/// Compares `mode` with the oracle for every aggregation, scope and weighting.
fn check_against_oracle(mode: PolicyLossMode) {
    let o = oracle::load("pl");
    let cfg = oracle_cfg(&o.meta);
    let g = &o.meta["global"];
    let global = AggOptions {
        dp_size: g["dp"].as_u64().unwrap() as usize,
        batch_num_tokens: g["n_tok"].as_f64(),
        global_batch_size: g["gbs"].as_f64(),
        loss_scale_factor: g["scale"].as_f64(),
        release: verlc_runtime::algo::AlgoRelease::V0_7_0,
    };
    for agg_mode in MODES {
        for (scope, agg) in [("local", AggOptions::default()), ("global", global)] {
            for weighted in [false, true] {
                let key = format!(
                    "{mode}/{agg_mode}/{scope}/{}",
                    if weighted { "w" } else { "now" }
                );
                let lp = leaf(o.get("lp"));
                let mut inputs =
                    PolicyLossInputs::new(o.get("old"), &lp, o.get("adv"), o.get("mask"));
                if weighted {
                    inputs = inputs.rollout_is_weights(o.get("w"));
                }
                let out = compute_policy_loss(mode, &inputs, &cfg, agg_mode, &agg).unwrap();
                assert_near(
                    scalar(&out.loss),
                    o.f64(&format!("{key}/loss")),
                    1e-10,
                    &format!("{key} loss"),
                );
                out.loss.backward();
                assert_close(
                    &lp.grad(),
                    o.get(&format!("{key}/grad")),
                    1e-10,
                    &format!("{key} grad"),
                );
                let want = o.meta["metrics"][&key].as_object().unwrap();
                let got = out.metrics.named().unwrap();
                assert_eq!(
                    got.len(),
                    want.len(),
                    "{key}: metric names {got:?} vs {want:?}"
                );
                for (name, value) in got {
                    let short = name.trim_start_matches("actor/");
                    let w = want
                        .get(short)
                        .and_then(|v| v.as_f64())
                        .unwrap_or_else(|| panic!("{key}: {name}"));
                    assert_near(value, w, 1e-10, &format!("{key} {name}"));
                }
            }
        }
    }
}

#[test]
fn vanilla_matches_oracle() {
    check_against_oracle(PolicyLossMode::Vanilla);
}

#[test]
fn gspo_matches_oracle() {
    check_against_oracle(PolicyLossMode::Gspo);
}

#[test]
fn sapo_matches_oracle() {
    check_against_oracle(PolicyLossMode::Sapo);
}

#[test]
fn gpg_matches_oracle() {
    check_against_oracle(PolicyLossMode::Gpg);
}

#[test]
fn clip_cov_matches_oracle() {
    // clip_cov_ratio = 1 in the oracle: every candidate is detached, the draw does not matter
    // (but it consumes the global generator, hence the lock).
    let _rng = rng_lock();
    check_against_oracle(PolicyLossMode::ClipCov);
}

#[test]
fn kl_cov_matches_oracle() {
    check_against_oracle(PolicyLossMode::KlCov);
}

#[test]
fn geo_mean_matches_oracle() {
    check_against_oracle(PolicyLossMode::GeoMean);
}

#[test]
fn cispo_matches_oracle() {
    check_against_oracle(PolicyLossMode::Cispo);
}

#[test]
fn dppo_tv_matches_oracle() {
    check_against_oracle(PolicyLossMode::DppoTv);
}

#[test]
fn dppo_kl_matches_oracle() {
    check_against_oracle(PolicyLossMode::DppoKl);
}

#[test]
fn dro_matches_oracle() {
    check_against_oracle(PolicyLossMode::Dro);
}

/// The losses verl added after 0.7 against verl 0.9.1's own functions (run from its source by
/// tests/oracle/verl_fn_oracle.py, with its agg_loss and masked_mean): loss, gradient and
/// metrics for every aggregation, local and global, with and without rollout weights.
#[test]
fn dppo_and_dro_are_verl_0_9s() {
    let o = oracle::verl_functions("policy_losses_0_9");
    let m = |k: &str| crate::support::json_matrix(&o[k]);
    let (old, adv, mask, w) = (m("old_log_prob"), m("advantages"), m("mask"), m("weights"));
    let s = &o["settings"];
    let f = |k: &str| s[k].as_f64().expect("setting");
    let cfg = PolicyLossConfig {
        clip_ratio: f("clip_ratio"),
        clip_ratio_low: Some(f("clip_ratio_low")),
        clip_ratio_high: Some(f("clip_ratio_high")),
        clip_ratio_c: f("clip_ratio_c"),
        dro_beta: Some(f("dro_beta")),
        ..PolicyLossConfig::default()
    };
    let g = &o["global"];
    let global = AggOptions {
        dp_size: g["dp_size"].as_u64().expect("dp") as usize,
        batch_num_tokens: g["batch_num_tokens"].as_f64(),
        global_batch_size: g["global_batch_size"].as_f64(),
        loss_scale_factor: g["loss_scale_factor"].as_f64(),
        release: verlc_runtime::algo::AlgoRelease::NEWEST,
    };
    let cases = o["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 3 * 5 * 2 * 2);
    for case in cases {
        let mode: PolicyLossMode = case["mode"].as_str().expect("mode").parse().unwrap();
        let agg_mode: LossAggMode = case["agg"].as_str().expect("agg").parse().unwrap();
        let agg = if case["global"] == true {
            global
        } else {
            AggOptions::default()
        };
        let what = format!(
            "{mode} {agg_mode} global={} weighted={}",
            case["global"], case["weighted"]
        );
        let lp = leaf(&m("log_prob"));
        let mut inputs = PolicyLossInputs::new(&old, &lp, &adv, &mask);
        if case["weighted"] == true {
            inputs = inputs.rollout_is_weights(&w);
        }
        let out = compute_policy_loss(mode, &inputs, &cfg, agg_mode, &agg).unwrap();
        // The default release is 0.9.1's, whose `seq-mean-token-sum-norm` these are.
        let loss = &out.loss;
        assert_near(scalar(loss), case["loss"].as_f64().unwrap(), 1e-10, &what);
        loss.backward();
        assert_close(
            &lp.grad(),
            &crate::support::json_matrix(&case["grad"]),
            1e-10,
            &what,
        );
        let want = case["metrics"].as_object().expect("metrics");
        let got = out.metrics.named().unwrap();
        assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
        for (name, value) in got {
            let theirs = want[name]
                .as_f64()
                .unwrap_or_else(|| panic!("{what}: {name}"));
            // verl's masked_mean divides by (mask sum + 1e-8) in float64 as verlc does.
            assert_near(value, theirs, 1e-9, &format!("{what} {name}"));
        }
    }
}

#[test]
fn dro_without_a_positive_beta_is_an_error() {
    let opts = (Kind::Double, tch::Device::Cpu);
    let t = Tensor::zeros([2, 3], opts);
    for beta in [None, Some(0.0), Some(-1.0)] {
        let cfg = PolicyLossConfig {
            dro_beta: beta,
            ..PolicyLossConfig::default()
        };
        let err = compute_policy_loss(
            PolicyLossMode::Dro,
            &PolicyLossInputs::new(&t, &t, &t, &t),
            &cfg,
            LossAggMode::TokenMean,
            &AggOptions::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("dro_beta"), "{err}");
    }
}

// ---- hand-derived cases ------------------------------------------------------------------------

/// One token: loss and gradient of `mode` for log-ratio `delta` and advantage `adv`.
fn one_token(
    mode: PolicyLossMode,
    delta: f64,
    adv: f64,
    cfg: &PolicyLossConfig,
) -> (f64, f64, Vec<(&'static str, f64)>) {
    let old = t2(&[&[-1.0]]);
    let lp = leaf(&t2(&[&[-1.0 + delta]]));
    let (a, m) = (t2(&[&[adv]]), t2(&[&[1.0]]));
    let out = compute_policy_loss(
        mode,
        &PolicyLossInputs::new(&old, &lp, &a, &m),
        cfg,
        LossAggMode::TokenMean,
        &AggOptions::default(),
    )
    .unwrap();
    out.loss.backward();
    (
        scalar(&out.loss),
        scalar(&lp.grad()),
        out.metrics.named().unwrap(),
    )
}

fn metric(ms: &[(&'static str, f64)], name: &str) -> f64 {
    ms.iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no metric {name} in {ms:?}"))
}

#[test]
fn vanilla_hand_derived() {
    let cfg = PolicyLossConfig {
        clip_ratio_low: Some(0.2),
        clip_ratio_high: Some(0.28),
        ..PolicyLossConfig::default()
    };
    // ρ = 1.1 inside [0.8, 1.28], A = 2: ℓ = −2·1.1 = −2.2; dℓ/dlogπ = −Aρ = −2.2; nothing clipped;
    // ppo_kl = −Δ = −ln 1.1.
    let (l, g, ms) = one_token(PolicyLossMode::Vanilla, 1.1f64.ln(), 2.0, &cfg);
    assert_near(l, -2.2, 1e-12, "loss");
    assert_near(g, -2.2, 1e-12, "grad");
    assert_eq!(metric(&ms, "actor/pg_clipfrac"), 0.0);
    assert_near(metric(&ms, "actor/ppo_kl"), -(1.1f64.ln()), 1e-7, "ppo_kl");
    // ρ = 1.5 > 1 + ε_h, A = 1: ℓ1 = −1.5, ℓ2 = −1.28 → ℓ = −1.28 (clipped, zero gradient).
    let (l, g, ms) = one_token(PolicyLossMode::Vanilla, 1.5f64.ln(), 1.0, &cfg);
    assert_near(l, -1.28, 1e-12, "clipped loss");
    assert_eq!(g, 0.0);
    assert_near(metric(&ms, "actor/pg_clipfrac"), 1.0, 1e-7, "clipfrac");
    // ρ = 0.5 < 1 − ε_l, A = −1: ℓ1 = 0.5, ℓ2 = 0.8 → ℓ = 0.8 (clipped below), gradient 0.
    let (l, g, _) = one_token(PolicyLossMode::Vanilla, 0.5f64.ln(), -1.0, &cfg);
    assert_near(l, 0.8, 1e-12, "lower clip");
    assert_eq!(g, 0.0);
}

#[test]
fn dual_clip_caps_the_loss_for_negative_advantages() {
    let cfg = PolicyLossConfig::default(); // c = 3
    // A = −1, ρ = e³ ≈ 20.09: ℓ1 = 20.09, ℓ2 = −A·1.2 = 1.2, ℓc = 20.09 > −A·c = 3 → ℓ = 3, and the
    // gradient is 0 (the cap is a constant); pg_clipfrac_lower = 1.
    let (l, g, ms) = one_token(PolicyLossMode::Vanilla, 3.0, -1.0, &cfg);
    assert_near(l, 3.0, 1e-12, "capped loss");
    assert_eq!(g, 0.0);
    assert_near(
        metric(&ms, "actor/pg_clipfrac_lower"),
        1.0,
        1e-7,
        "clipfrac_lower",
    );
    // Below the cap (ρ = 2 < c): ℓ = −Aρ = 2 with gradient −Aρ = 2, pg_clipfrac_lower = 0.
    let (l, g, ms) = one_token(PolicyLossMode::Vanilla, 2.0f64.ln(), -1.0, &cfg);
    assert_near(l, 2.0, 1e-12, "uncapped");
    assert_near(g, 2.0, 1e-12, "uncapped grad");
    assert_eq!(metric(&ms, "actor/pg_clipfrac_lower"), 0.0);
    // The cap never applies to positive advantages: A = 1, ρ = e³ → ℓ = −1.2.
    let (l, _, ms) = one_token(PolicyLossMode::Vanilla, 3.0, 1.0, &cfg);
    assert_near(l, -1.2, 1e-12, "positive advantage");
    assert_eq!(metric(&ms, "actor/pg_clipfrac_lower"), 0.0);
    // Property over a random batch: every token's loss is ≤ −A·c where A < 0.
    let _rng = rng_lock();
    tch::manual_seed(8);
    let opts = (Kind::Double, tch::Device::Cpu);
    let old = Tensor::randn([8, 8], opts);
    let lp = &old + Tensor::randn([8, 8], opts) * 3.0;
    let a = Tensor::randn([8, 8], opts);
    let m = Tensor::ones([1, 1], opts);
    let mut capped = 0;
    for i in 0..8 {
        for t in 0..8 {
            let pick = |x: &Tensor| x.narrow(0, i, 1).narrow(1, t, 1);
            let (o, l, adv_t) = (pick(&old), pick(&lp), pick(&a));
            let ins = PolicyLossInputs::new(&o, &l, &adv_t, &m);
            let out = compute_policy_loss(
                PolicyLossMode::Vanilla,
                &ins,
                &cfg,
                LossAggMode::TokenMean,
                &AggOptions::default(),
            )
            .unwrap();
            let adv = scalar(&pick(&a));
            if adv < 0.0 {
                let cap = -adv * 3.0;
                assert!(scalar(&out.loss) <= cap + 1e-12, "token ({i}, {t})");
                capped += usize::from((scalar(&out.loss) - cap).abs() < 1e-12);
            }
        }
    }
    assert!(capped > 0, "the random batch exercises the cap");
}

#[test]
fn gspo_uses_the_sequence_ratio_with_token_gradients() {
    // One sequence, Δ = [0.1, 0.3]: log s = 0.2, ρ̃ = e^0.2 = 1.2214 for both tokens (inside
    // [0.8, 1.28]); A = 1: ℓ_t = −1.2214; seq-mean-token-mean = −1.2214. Each token's gradient
    // is −A·ρ̃/2 (the token's own log-prob carries the gradient, averaged over 2 tokens).
    let old = t2(&[&[-1.0, -2.0]]);
    let lp = leaf(&t2(&[&[-0.9, -1.7]]));
    let (a, m) = (t2(&[&[1.0, 1.0]]), t2(&[&[1.0, 1.0]]));
    let cfg = PolicyLossConfig {
        clip_ratio_high: Some(0.28),
        release: verlc_runtime::algo::AlgoRelease::V0_7_0,
        ..PolicyLossConfig::default()
    };
    // Before verl 0.9.1 the configured agg mode is ignored (always seq-mean-token-mean).
    let out = compute_policy_loss(
        PolicyLossMode::Gspo,
        &PolicyLossInputs::new(&old, &lp, &a, &m),
        &cfg,
        LossAggMode::SeqMeanTokenSum,
        &AggOptions::default(),
    )
    .unwrap();
    let r = 0.2f64.exp();
    assert_near(scalar(&out.loss), -r, 1e-7, "loss");
    out.loss.backward();
    assert_close(&lp.grad(), &t2(&[&[-r / 2.0, -r / 2.0]]), 1e-7, "grad");
    // From 0.9.1 it is honoured: seq-mean-token-sum gives the sequence's sum, −2ρ̃.
    let lp = leaf(&t2(&[&[-0.9, -1.7]]));
    let newer = PolicyLossConfig {
        release: verlc_runtime::algo::AlgoRelease::NEWEST,
        ..cfg
    };
    let out = compute_policy_loss(
        PolicyLossMode::Gspo,
        &PolicyLossInputs::new(&old, &lp, &a, &m),
        &newer,
        LossAggMode::SeqMeanTokenSum,
        &AggOptions::default(),
    )
    .unwrap();
    assert_near(scalar(&out.loss), -2.0 * r, 1e-7, "loss (0.9.1)");
}

#[test]
fn sapo_gate_matches_ppo_gradient_on_policy() {
    // At ρ = 1: f(1) = σ(0)·4/τ = 2/τ and f'(1) = τ·σ'(0)·4/τ = 1, so ℓ = −2A/τ and
    // dℓ/dlogπ = −A·f'(ρ)·ρ = −A, the on-policy PPO gradient. A = 1 (τ_pos = 1): ℓ = −2;
    // A = −1 (τ_neg = 1.05): ℓ = 2/1.05 = 1.9047619, gradient +1. (SAPO always aggregates with
    // seq-mean-token-mean, whose 1e-8 in the token mean bounds the precision.)
    let cfg = PolicyLossConfig::default();
    let (l, g, ms) = one_token(PolicyLossMode::Sapo, 0.0, 1.0, &cfg);
    assert_near(l, -2.0, 1e-7, "loss A>0");
    assert_near(g, -1.0, 1e-7, "grad A>0");
    assert_eq!(metric(&ms, "actor/pg_clipfrac"), 0.0);
    let (l, g, _) = one_token(PolicyLossMode::Sapo, 0.0, -1.0, &cfg);
    assert_near(l, 2.0 / 1.05, 1e-7, "loss A<0");
    assert_near(g, 1.0, 1e-7, "grad A<0");
}

#[test]
fn gpg_is_plain_policy_gradient() {
    // ℓ = −A·log π: log π = −1 + 0.3 = −0.7, A = 2 → ℓ = 1.4, gradient −A = −2; no metrics.
    let (l, g, ms) = one_token(PolicyLossMode::Gpg, 0.3, 2.0, &PolicyLossConfig::default());
    assert_near(l, 1.4, 1e-12, "loss");
    assert_near(g, -2.0, 1e-12, "grad");
    assert!(ms.is_empty());
}

#[test]
fn cispo_keeps_gradients_of_clipped_tokens() {
    // Δ = 1 (ρ = e > 1.2), A = 1: ℓ = −sg(1.2)·A·log π = −1.2·(−1 + 1) = 0; the gradient is
    // −1.2·A = −1.2 although the ratio is clipped (vanilla's would be 0); pg_clipfrac = 1.
    let (l, g, ms) = one_token(
        PolicyLossMode::Cispo,
        1.0,
        1.0,
        &PolicyLossConfig::default(),
    );
    assert_near(l, 0.0, 1e-12, "loss");
    assert_near(g, -1.2, 1e-12, "grad");
    assert_near(metric(&ms, "actor/pg_clipfrac"), 1.0, 1e-7, "clipfrac");
}

#[test]
fn geo_mean_hand_derived() {
    // One sequence, A = 1 on both tokens, Δ = [0.1, 0.5], ε_h = 0.28: δ* = [0.1, 0.28] (the larger
    // ratio is clipped for A > 0); ρ = exp((0.1 + 0.28)/2) = e^0.19; Â = 1; ℓ = −e^0.19 = −1.2092496.
    // Gradient: only the unclipped token, −e^0.19/2. pg_clipfrac = 1/2, pg_clipfrac_lower = 0.
    let old = t2(&[&[-1.0, -1.0]]);
    let lp = leaf(&t2(&[&[-0.9, -0.5]]));
    let (a, m) = (t2(&[&[1.0, 1.0]]), t2(&[&[1.0, 1.0]]));
    let cfg = PolicyLossConfig {
        clip_ratio_high: Some(0.28),
        ..PolicyLossConfig::default()
    };
    let out = compute_policy_loss(
        PolicyLossMode::GeoMean,
        &PolicyLossInputs::new(&old, &lp, &a, &m),
        &cfg,
        LossAggMode::TokenMean,
        &AggOptions::default(),
    )
    .unwrap();
    let e = 0.19f64.exp();
    assert_near(scalar(&out.loss), -e, 1e-7, "loss");
    out.loss.backward();
    assert_close(&lp.grad(), &t2(&[&[-e / 2.0, 0.0]]), 1e-7, "grad");
    let ms = out.metrics.named().unwrap();
    assert_near(metric(&ms, "actor/pg_clipfrac"), 0.5, 1e-7, "clipfrac");
    assert_eq!(metric(&ms, "actor/pg_clipfrac_lower"), 0.0);
}

#[test]
fn kl_cov_penalises_the_top_covariance_tokens() {
    // Valid tokens (A, log π): (2, −0.5), (−1, −2), (0, −1), (1, −0.5): mean A = 0.5,
    // mean log π = −1; cov = [1.5·0.5, −1.5·−1, −0.5·0, 0.5·0.5] = [0.75, 1.5, 0, 0.25].
    // kl_cov_ratio = 0.5 → k = 2: tokens 1 and 0 get ℓ = −Aρ + coef·|Δ|.
    let lp = leaf(&t2(&[&[-0.5, -2.0, -1.0, -0.5]]));
    let old = t2(&[&[-0.7, -1.5, -1.0, -0.5]]);
    let (a, m) = (t2(&[&[2.0, -1.0, 0.0, 1.0]]), t2(&[&[1.0; 4]]));
    let cfg = PolicyLossConfig {
        kl_cov_ratio: 0.5,
        ppo_kl_coef: 0.5,
        ..PolicyLossConfig::default()
    };
    // seq-mean-token-sum over one sequence = Σ_t ℓ_t.
    let (d, adv) = ([0.2f64, -0.5, 0.0, 0.0], [2.0, -1.0, 0.0, 1.0]);
    let want: f64 = (0..4)
        .map(|t| -adv[t] * d[t].exp() + if t < 2 { 0.5 * d[t].abs() } else { 0.0 })
        .sum();
    let out = kl_cov::compute(
        &PolicyLossInputs::new(&old, &lp, &a, &m),
        &cfg,
        LossAggMode::SeqMeanTokenSum,
        &AggOptions::default(),
    )
    .unwrap();
    assert_near(scalar(&out.loss), want, 1e-12, "loss");
    let ms = out.metrics.named().unwrap();
    assert_eq!(ms.len(), 1);
    assert_near(
        metric(&ms, "actor/ppo_kl"),
        0.7 / 4.0,
        1e-7,
        "ppo_kl = mean |Δ|",
    );
}

#[test]
fn clip_cov_detaches_a_random_subset_of_candidates() {
    // Many tokens fall in the covariance band; clip_cov_ratio = 0.1 of 60 valid tokens → 6 are
    // detached: exactly those get a zero gradient, all are candidates, the draw follows the seed.
    let opts = (Kind::Double, tch::Device::Cpu);
    let _rng = rng_lock();
    tch::manual_seed(21);
    let old = Tensor::randn([6, 10], opts) - 2.0;
    let lp_val = &old + Tensor::randn([6, 10], opts) * 0.05;
    let a = Tensor::randn([6, 10], opts) * 3.0;
    let m = Tensor::ones([6, 10], opts);
    let cfg = PolicyLossConfig {
        clip_cov_ratio: 0.1,
        clip_cov_lb: -100.0,
        clip_cov_ub: 100.0,
        ..PolicyLossConfig::default()
    };
    let run = |seed: i64| {
        tch::manual_seed(seed);
        let lp = leaf(&lp_val);
        let out = clip_cov::compute(
            &PolicyLossInputs::new(&old, &lp, &a, &m),
            &cfg,
            LossAggMode::TokenMean,
            &AggOptions::default(),
        )
        .unwrap();
        out.loss.backward();
        let zero: Vec<usize> = to_vec(&lp.grad())
            .iter()
            .enumerate()
            .filter(|(_, g)| **g == 0.0)
            .map(|(i, _)| i)
            .collect();
        (zero, out.metrics.named().unwrap())
    };
    // Tokens already clipped by the ratio also have zero gradient; with Δ ~ 0.05 none are.
    let (a1, ms) = run(1);
    assert_eq!(a1.len(), 6, "detached tokens: {a1:?}");
    assert_near(
        metric(&ms, "actor/pg_clipfrac"),
        0.1,
        1e-7,
        "clipfrac = detached / valid",
    );
    let (a2, _) = run(1);
    assert_eq!(a1, a2, "same seed, same draw");
    let (a3, _) = run(2);
    assert_ne!(a1, a3, "another seed, another draw");
    // Tokens outside the band are never detached.
    let narrow = PolicyLossConfig {
        clip_cov_lb: 1e6,
        ..cfg
    };
    let lp = leaf(&lp_val);
    let out = clip_cov::compute(
        &PolicyLossInputs::new(&old, &lp, &a, &m),
        &narrow,
        LossAggMode::TokenMean,
        &AggOptions::default(),
    )
    .unwrap();
    assert_eq!(
        metric(&out.metrics.named().unwrap(), "actor/pg_clipfrac"),
        0.0
    );
}

#[test]
fn rollout_weights_scale_the_token_losses() {
    let opts = (Kind::Double, tch::Device::Cpu);
    let _rng = rng_lock();
    tch::manual_seed(4);
    let old = Tensor::randn([3, 4], opts);
    let lp = &old + Tensor::randn([3, 4], opts) * 0.1;
    let a = Tensor::randn([3, 4], opts);
    let m = Tensor::ones([3, 4], opts);
    let w = Tensor::full([3, 4], 2.0, opts);
    let cfg = PolicyLossConfig {
        dro_beta: Some(0.3),
        ..PolicyLossConfig::default()
    };
    for mode in PolicyLossMode::ALL
        .iter()
        .copied()
        .filter(|m| *m != PolicyLossMode::GeoMean)
    {
        tch::manual_seed(1); // clip_cov's random draw is the same in both calls
        let plain = compute_policy_loss(
            mode,
            &PolicyLossInputs::new(&old, &lp, &a, &m),
            &cfg,
            LossAggMode::TokenMean,
            &AggOptions::default(),
        )
        .unwrap();
        tch::manual_seed(1);
        let weighted = compute_policy_loss(
            mode,
            &PolicyLossInputs::new(&old, &lp, &a, &m).rollout_is_weights(&w),
            &cfg,
            LossAggMode::TokenMean,
            &AggOptions::default(),
        )
        .unwrap();
        assert_near(
            scalar(&weighted.loss),
            2.0 * scalar(&plain.loss),
            1e-12,
            mode.as_str(),
        );
    }
}

#[test]
fn invalid_parameters_and_shapes_are_errors() {
    let (old, lp, a, m) = (t2(&[&[-1.0]]), t2(&[&[-1.0]]), t2(&[&[1.0]]), t2(&[&[1.0]]));
    let ins = PolicyLossInputs::new(&old, &lp, &a, &m);
    let agg = AggOptions::default();
    let bad_c = PolicyLossConfig {
        clip_ratio_c: 1.0,
        ..PolicyLossConfig::default()
    };
    let err = compute_policy_loss(
        PolicyLossMode::Vanilla,
        &ins,
        &bad_c,
        LossAggMode::TokenMean,
        &agg,
    )
    .unwrap_err();
    assert!(err.to_string().contains("clip_ratio_c"), "{err}");
    let bad = PolicyLossConfig {
        clip_cov_ratio: 0.0,
        kl_cov_ratio: 0.0,
        ..PolicyLossConfig::default()
    };
    for mode in [PolicyLossMode::ClipCov, PolicyLossMode::KlCov] {
        assert!(matches!(
            compute_policy_loss(mode, &ins, &bad, LossAggMode::TokenMean, &agg),
            Err(AlgoError::Config(_))
        ));
    }
    let wide = t2(&[&[1.0, 1.0]]);
    for mode in PolicyLossMode::ALL.iter().copied() {
        let err = compute_policy_loss(
            mode,
            &PolicyLossInputs::new(&old, &lp, &wide, &m),
            &PolicyLossConfig::default(),
            LossAggMode::TokenMean,
            &agg,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                AlgoError::Shape {
                    name: "advantages",
                    ..
                }
            ),
            "{mode}: {err}"
        );
    }
    let _ = policy_loss::vanilla::compute; // per-loss functions are public too
}
