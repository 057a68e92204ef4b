//! KL controllers and the in-reward KL penalty.
use verlc_runtime::algo::{KlController, apply_kl_penalty};

use crate::oracle;
use crate::support::{assert_close, assert_near, t2, to_vec};

#[test]
fn in_reward_penalty_matches_oracle() {
    let o = oracle::load("kl_ctrl");
    let f = |k: &str| o.meta[k].as_f64().unwrap();
    let mut ctrl = KlController::adaptive(f("beta"), f("target"), f("horizon")).unwrap();
    let out = apply_kl_penalty(
        o.get("scores"),
        o.get("old"),
        o.get("ref"),
        o.get("mask"),
        "low_var_kl".parse().unwrap(),
        &mut ctrl,
    )
    .unwrap();
    assert_close(
        &out.token_level_rewards,
        o.get("rewards"),
        1e-12,
        "token_level_rewards",
    );
    assert_near(out.reward_kl_penalty, f("current_kl"), 1e-12, "current kl");
    assert_eq!(
        out.reward_kl_penalty_coeff,
        f("beta"),
        "the metric is β before the update"
    );
    assert_near(ctrl.value(), f("new_beta"), 1e-12, "updated β");
    let names: Vec<&str> = out.metrics().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        ["actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"]
    );
}

#[test]
fn adaptive_controller_hand_derived() {
    // target 0.05, horizon 100, n = 4. KL 0.1: e = clip(0.1/0.05 − 1, ±0.2) = 0.2,
    // β = 0.1·(1 + 0.2·4/100) = 0.1008. KL 0.04: e = clip(−0.2) = −0.2, β = 0.1008·0.992.
    // KL 0.055: e = 0.1, β ·= 1.004.
    let mut c = KlController::adaptive(0.1, 0.05, 100.0).unwrap();
    c.update(0.1, 4);
    assert_near(c.value(), 0.1008, 1e-15, "above target");
    c.update(0.04, 4);
    assert_near(c.value(), 0.1008 * 0.992, 1e-15, "below target");
    c.update(0.055, 4);
    assert_near(c.value(), 0.1008 * 0.992 * 1.004, 1e-12, "inside the clip");
    assert!(KlController::adaptive(0.1, 0.05, 0.0).is_err());
}

#[test]
fn fixed_controller_keeps_beta() {
    let mut c = KlController::fixed(0.02);
    c.update(10.0, 1000);
    assert_eq!(c.value(), 0.02);
}

#[test]
fn penalty_applies_only_to_valid_tokens() {
    // k1: KL = old − ref = [[0.5, 0.5], [1, 1]] masked by [[1, 0], [1, 1]]; β = 0.2.
    // rewards = scores − 0.2·KL·m = [[1 − 0.1, 2], [3 − 0.2, 4 − 0.2]];
    // current_kl = mean(0.5/1, 2/2) = 0.75.
    let scores = t2(&[&[1.0, 2.0], &[3.0, 4.0]]);
    let old = t2(&[&[-0.5, -0.5], &[0.0, 0.0]]);
    let reference = t2(&[&[-1.0, -1.0], &[-1.0, -1.0]]);
    let mask = t2(&[&[1.0, 0.0], &[1.0, 1.0]]);
    let mut c = KlController::fixed(0.2);
    let out = apply_kl_penalty(
        &scores,
        &old,
        &reference,
        &mask,
        "kl".parse().unwrap(),
        &mut c,
    )
    .unwrap();
    assert_close(
        &out.token_level_rewards,
        &t2(&[&[0.9, 2.0], &[2.8, 3.8]]),
        1e-12,
        "rewards",
    );
    assert_near(out.reward_kl_penalty, 0.75, 1e-8, "current kl");
    assert_eq!(to_vec(&out.token_level_rewards).len(), 4);
}
