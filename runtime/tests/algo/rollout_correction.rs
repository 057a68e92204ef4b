//! Rollout correction (decoupled mode) equals verl 0.7.0's own
//! `compute_rollout_correction_and_rejection_mask` (run from the installed source by
//! verl_fn_oracle.py): importance weights (token, sequence, batch-normalised), rejection masks
//! (token, sequence, geometric, explicit lower bound), the veto, and every metric verlc logs;
//! and verl 0.9.1's, with IcePop's bounds and 0.8's metrics.

use serde_json::json;
use tch::Kind;
use verlc_runtime::algo::rollout_correction::rollout_correction;
use verlc_spec::trainer::{
    CorrectionForm, IsLevel, RejectionSpec, RolloutCorrectionSpec, RsAggregate, RsCriterion,
    RsLevel,
};

use crate::support::json_matrix as tensor;

/// The largest difference of `t` from the oracle's matrix `want`.
fn max_diff(t: &tch::Tensor, want: &serde_json::Value) -> f64 {
    (t.to_kind(Kind::Double) - tensor(want))
        .abs()
        .max()
        .double_value(&[])
}

fn spec(cfg: &serde_json::Value) -> RolloutCorrectionSpec {
    let f = |k: &str| cfg.get(k).and_then(serde_json::Value::as_f64);
    let s = |k: &str| cfg.get(k).and_then(serde_json::Value::as_str);
    RolloutCorrectionSpec {
        is_level: s("rollout_is").map(|l| {
            if l == "token" {
                IsLevel::Token
            } else {
                IsLevel::Sequence
            }
        }),
        is_threshold: f("rollout_is_threshold").unwrap_or(2.0),
        is_batch_normalize: cfg
            .get("rollout_is_batch_normalize")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false),
        rejection: s("rollout_rs").map(|l| {
            let upper = f("rollout_rs_threshold").expect("threshold");
            RejectionSpec {
                level: match l {
                    "token" => RsLevel::Token,
                    "sequence" => RsLevel::Sequence,
                    _ => RsLevel::Geometric,
                },
                upper,
                lower: f("rollout_rs_threshold_lower").unwrap_or(1.0 / upper),
            }
        }),
        is_threshold_lower: None,
        veto_threshold: f("rollout_token_veto_threshold"),
        criteria: Vec::new(),
        form: CorrectionForm::Verl07,
    }
}

/// The spec of a verl 0.9 oracle case: the threshold as a number or a string (`"lower_upper"`:
/// IcePop), and the one rejection option the cases use.
fn spec_0_9(cfg: &serde_json::Value) -> RolloutCorrectionSpec {
    let mut s = spec(&json!({
        "rollout_is": cfg["rollout_is"],
        "rollout_is_batch_normalize": cfg.get("rollout_is_batch_normalize"),
    }));
    let (upper, lower) = match &cfg["rollout_is_threshold"] {
        serde_json::Value::String(t) => match t.split_once('_') {
            Some((lo, hi)) => (hi.parse().unwrap(), Some(lo.parse().unwrap())),
            None => (t.parse().unwrap(), None),
        },
        v => (v.as_f64().unwrap(), None),
    };
    s.is_threshold = upper;
    s.is_threshold_lower = lower;
    s.form = CorrectionForm::Verl08;
    if let Some(option) = cfg.get("rollout_rs").and_then(serde_json::Value::as_str) {
        assert_eq!(
            (option, &cfg["rollout_rs_threshold"]),
            ("token_k1", &json!("0.3_3.0"))
        );
        s.criteria = vec![RsCriterion {
            name: option.into(),
            aggregate: RsAggregate::Token,
            estimator: verlc_spec::algo::KlKind::K1,
            lower: Some(0.3),
            upper: 3.0,
        }];
    }
    s
}

/// Rollout correction as verl 0.9.1 computes it (its own function run from the unpacked tree):
/// truncated weights from a number and a numeric string, IcePop's zeroed weights from
/// `"lower_upper"`, per token and per sequence, batch-normalised, with a rejection option
/// beside; weights and mask, and exactly verl's metrics (0.8's: the applied weights'
/// statistics, the raw weights' fractions, `rollout_is_seq_*`, `rollout_is_oob_ratio`, no
/// veto).
#[test]
fn rollout_correction_is_verl_0_9s() {
    let o = crate::oracle::verl_functions("rollout_corr_0_9");
    let (old, rollout, mask) = (tensor(&o["old"]), tensor(&o["rollout"]), tensor(&o["mask"]));
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
    let cases = o["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 7);
    for case in cases {
        let cfg = &case["config"];
        let c = rollout_correction(&old, &rollout, &mask.to_kind(Kind::Float), &spec_0_9(cfg))
            .expect("correction");
        let w = c.weights.as_ref().expect("weights");
        assert!(
            max_diff(w, &case["weights"]) < 1e-5,
            "{cfg}: weights differ"
        );
        assert_eq!(
            max_diff(&c.response_mask, &case["mask"]),
            0.0,
            "{cfg}: masks differ"
        );
        let theirs = case["metrics"].as_object().expect("metrics");
        let ours: Vec<&String> = c.metrics.keys().collect();
        let mut want: Vec<&String> = theirs.keys().collect();
        want.sort();
        assert_eq!(ours, want, "{cfg}: metric names");
        for (k, v) in &c.metrics {
            let t = theirs[k].as_f64().unwrap();
            assert!(close(*v, t), "{cfg}: {k} = {v}, verl {t}");
        }
    }
}

#[test]
fn rollout_correction_is_verls() {
    let o = crate::oracle::verl_functions("rollout_corr");
    let (old, rollout, mask) = (tensor(&o["old"]), tensor(&o["rollout"]), tensor(&o["mask"]));
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
    for case in o["cases"].as_array().expect("cases") {
        let cfg = &case["config"];
        let c = rollout_correction(&old, &rollout, &mask.to_kind(Kind::Float), &spec(cfg))
            .expect("correction");
        match (&c.weights, case["weights"].is_null()) {
            (None, true) => {}
            (Some(w), false) => {
                let d = max_diff(w, &case["weights"]);
                assert!(d < 1e-5, "{cfg}: weights differ by {d}");
            }
            (w, _) => panic!(
                "{cfg}: weights {:?} vs verl's {}",
                w.is_some(),
                !case["weights"].is_null()
            ),
        }
        assert_eq!(
            max_diff(&c.response_mask, &case["mask"]),
            0.0,
            "{cfg}: masks differ"
        );
        let theirs = case["metrics"].as_object().expect("metrics");
        assert!(!c.metrics.is_empty());
        for (k, v) in &c.metrics {
            let t = theirs
                .get(k)
                .and_then(serde_json::Value::as_f64)
                .unwrap_or_else(|| panic!("{cfg}: verl has no metric {k}"));
            assert!(close(*v, t), "{cfg}: {k} = {v}, verl {t}");
        }
    }
}

/// Bypass mode's policy loss equals verl 0.7.0's `compute_policy_loss_bypass_mode` (PPO-clip
/// and REINFORCE, with and without importance weights and rejection): loss, gradient with
/// respect to the log-probs, and the metrics verlc logs.
#[test]
fn bypass_policy_loss_is_verls() {
    use verlc_runtime::algo::rollout_correction::bypass_policy_loss;
    use verlc_runtime::algo::{AggOptions, LossAggMode, PolicyLossConfig, PolicyLossInputs};
    use verlc_spec::trainer::{BypassLoss, BypassSpec};

    let o = crate::oracle::verl_functions("bypass");
    let f32t = |k: &str| tensor(&o[k]).to_kind(Kind::Float);
    let (rollout, adv, mask) = (f32t("rollout"), f32t("advantages"), f32t("mask"));
    let cfg = PolicyLossConfig {
        clip_ratio: 0.2,
        clip_ratio_low: Some(0.2),
        clip_ratio_high: Some(0.28),
        clip_ratio_c: 3.0,
        ..PolicyLossConfig::default()
    };
    let agg = AggOptions {
        dp_size: 1,
        batch_num_tokens: Some(mask.sum(Kind::Float).double_value(&[])),
        global_batch_size: Some(mask.size()[0] as f64),
        loss_scale_factor: None,
        release: verlc_runtime::algo::AlgoRelease::V0_7_0,
    };
    let cases = o["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 4);
    for case in cases {
        let b = BypassSpec {
            correction: spec(&case["correction"]),
            loss: if case["loss_type"] == "reinforce" {
                BypassLoss::Reinforce
            } else {
                BypassLoss::PpoClip
            },
        };
        let lp = f32t("log_prob").set_requires_grad(true);
        let inputs = PolicyLossInputs::new(&rollout, &lp, &adv, &mask);
        let (loss, metrics) =
            bypass_policy_loss(&b, &inputs, &cfg, LossAggMode::TokenMean, &agg).expect("loss");
        loss.backward();
        let what = &case["correction"];
        let want = case["loss"].as_f64().expect("loss");
        assert!(
            (loss.double_value(&[]) - want).abs() < 1e-5,
            "{what}: loss {} vs {want}",
            loss.double_value(&[])
        );
        let d = (lp.grad().to_kind(Kind::Double) - tensor(&case["grad"]))
            .abs()
            .max()
            .double_value(&[]);
        assert!(d < 1e-5, "{what}: gradient differs by {d}");
        let theirs = case["metrics"].as_object().expect("metrics");
        for (k, v) in &metrics {
            let t = theirs
                .get(k)
                .and_then(serde_json::Value::as_f64)
                .unwrap_or_else(|| panic!("{what}: verl has no metric {k}"));
            assert!(
                (v - t).abs() <= 1e-5 * (1.0 + t.abs()),
                "{what}: {k} = {v}, verl {t}"
            );
        }
        assert!(metrics.contains_key("actor/ppo_kl"));
    }
}
