//! On-policy distillation's loss term against verl 0.9.1's own `distillation_loss` (run from
//! its source by tests/oracle/verl_fn_oracle.py with its kl_penalty, agg_loss and vanilla
//! PPO loss): loss, gradient with respect to the student's log-probs and every metric, for
//! each estimator, supervised and as a policy gradient, clamped or not, under several
//! aggregations with global-batch information.
use runtime::algo::distillation::{DistillationInputs, DistillationLossSpec, distillation_term};
use runtime::algo::{AggOptions, KlKind, LossAggMode};

use crate::oracle;
use crate::support::{assert_close, assert_near, json_matrix, leaf, scalar};

#[test]
fn distillation_term_is_verl_0_9s() {
    let o = oracle::verl_functions("distillation_0_9");
    let m = |k: &str| json_matrix(&o[k]);
    let (old, teacher, mask) = (m("old_log_prob"), m("teacher_log_prob"), m("mask"));
    let g = &o["global"];
    let agg = AggOptions {
        dp_size: g["dp_size"].as_u64().expect("dp") as usize,
        batch_num_tokens: g["batch_num_tokens"].as_f64(),
        global_batch_size: g["global_batch_size"].as_f64(),
        loss_scale_factor: None,
    };
    let cases = o["cases"].as_array().expect("cases");
    assert_eq!(
        cases.len(),
        7 * 2 * 3,
        "(k1 with PG; abs, k2, k3 both ways) x clamps x aggs"
    );
    for case in cases {
        let mode = case["mode"].as_str().expect("mode");
        let agg_mode: LossAggMode = case["agg"].as_str().expect("agg").parse().unwrap();
        let spec = DistillationLossSpec {
            estimator: KlKind::from_verl_name(mode).expect("estimator"),
            use_task_rewards: false,
            coef: 1.0,
            loss_max_clamp: case["clamp"].as_f64(),
            use_policy_gradient: case["pg"] == true,
            clip_ratio_low: 0.15,
            clip_ratio_high: 0.25,
        };
        let what = format!(
            "{mode} pg={} clamp={} {agg_mode}",
            case["pg"], case["clamp"]
        );
        let student = leaf(&m("log_prob"));
        let inputs = DistillationInputs {
            log_prob: &student,
            teacher_log_prob: &teacher,
            old_log_prob: &old,
            response_mask: &mask,
            rollout_is_weights: None,
        };
        let term = distillation_term(&spec, &inputs, agg_mode, &agg).unwrap();
        assert_near(
            scalar(&term.loss),
            case["loss"].as_f64().unwrap(),
            1e-10,
            &what,
        );
        term.loss.backward();
        assert_close(&student.grad(), &json_matrix(&case["grad"]), 1e-10, &what);
        let want = case["metrics"].as_object().expect("metrics");
        assert_eq!(
            term.metrics.len(),
            want.len(),
            "{what}: {:?} vs {want:?}",
            term.metrics
        );
        for (name, value) in &term.metrics {
            let key = name.trim_start_matches("actor/");
            let theirs = want[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{what}: {key}"));
            assert_near(*value, theirs, 1e-9, &format!("{what} {name}"));
        }
    }
}
