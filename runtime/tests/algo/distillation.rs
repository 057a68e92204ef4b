//! On-policy distillation's loss term against verl 0.9.1's own `distillation_loss` (run from
//! its source by tests/oracle/verl_fn_oracle.py with its kl_penalty, agg_loss and vanilla
//! PPO loss): loss, gradient with respect to the student's log-probs and every metric, for
//! each estimator, supervised and as a policy gradient, clamped or not, under several
//! aggregations with global-batch information.
use tch::{Kind, Tensor};
use verlc_runtime::algo::distillation::{
    DistillationInputs, DistillationLossSpec, DistillationMode, Teacher, distillation_term,
};
use verlc_runtime::algo::topk_kl::TopKKl;
use verlc_runtime::algo::{AggOptions, KlKind, LossAggMode};
use verlc_runtime::logits::topk::{TopK, TopKTargets, topk_columns};

use crate::oracle;
use crate::support::{assert_close, assert_near, json_matrix, leaf, scalar};

#[test]
fn distillation_term_is_verl_0_9s() {
    let o = oracle::verl_functions("distillation_0_9");
    let m = |k: &str| json_matrix(&o[k]);
    let (old, teacher, mask) = (m("old_log_prob"), m("teacher_log_prob"), m("mask"));
    let agg = global_batch(&o["global"]);
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
            mode: DistillationMode::Estimator(KlKind::from_verl_name(mode).expect("estimator")),
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
            teacher: Teacher::LogProb(&teacher),
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
        assert_metrics(&term.metrics, &case["metrics"], 1e-9, &what);
    }
}

/// The global-batch facts the oracle aggregated with.
fn global_batch(g: &serde_json::Value) -> AggOptions {
    AggOptions {
        dp_size: g["dp_size"].as_u64().expect("dp") as usize,
        batch_num_tokens: g["batch_num_tokens"].as_f64(),
        global_batch_size: g["global_batch_size"].as_f64(),
        loss_scale_factor: None,
        release: verlc_runtime::algo::AlgoRelease::NEWEST,
    }
}

/// Every metric verl logged, and no other, to `tol`.
fn assert_metrics(ours: &[(String, f64)], theirs: &serde_json::Value, tol: f64, what: &str) {
    let want = theirs.as_object().expect("metrics");
    assert_eq!(ours.len(), want.len(), "{what}: {ours:?} vs {want:?}");
    for (name, value) in ours {
        let key = name.trim_start_matches("actor/");
        let theirs = want[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{what}: {key}"));
        assert_near(*value, theirs, tol, &format!("{what} {name}"));
    }
}

/// The top-k forward KL (`forward_kl_topk`) against verl 0.9.1's: its FSDP logits processor
/// and `distillation_loss` on the same student logits and teacher top-k (oracle
/// `distillation_topk_0_9`). Ours runs the engines' column function on the logits, then the
/// actor's term: loss, gradient with respect to the logits and every metric, supervised and as
/// a policy gradient, with the log-prob clamp and the loss clamp. verl's `kl_divergence` casts
/// to f32 whatever it is given, so the KL and what derives from it agree to f32's precision
/// (ours keeps the oracle's f64).
#[test]
fn topk_distillation_term_is_verl_0_9s() {
    let o = oracle::verl_functions("distillation_topk_0_9");
    let m = |k: &str| json_matrix(&o[k]);
    let (rows, width) = (m("mask").size()[0], m("mask").size()[1]);
    let k = o["topk"].as_i64().unwrap();
    let grid = |key: &str| grid_of(&o[key], rows, width);
    let targets = TopKTargets {
        ids: grid("teacher_ids").to_kind(Kind::Int64),
        log_probs: grid("teacher_log_probs"),
    };
    let labels = m("labels").to_kind(Kind::Int64);
    let (old, mask) = (m("old_log_prob"), m("mask"));
    let agg = global_batch(&o["global"]);
    let cases = o["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 8, "pg x log-prob clamp x aggs");
    for case in cases {
        let agg_mode: LossAggMode = case["agg"].as_str().unwrap().parse().unwrap();
        let log_prob_min_clamp = case["log_prob_min_clamp"].as_f64();
        let spec = DistillationLossSpec {
            mode: DistillationMode::ForwardKlTopk {
                topk: k,
                log_prob_min_clamp,
            },
            use_task_rewards: false,
            coef: 1.0,
            loss_max_clamp: case["loss_max_clamp"].as_f64(),
            use_policy_gradient: case["pg"] == true,
            clip_ratio_low: 0.15,
            clip_ratio_high: 0.25,
        };
        let what = format!(
            "pg={} clamps {log_prob_min_clamp:?} {:?} {agg_mode}",
            case["pg"], spec.loss_max_clamp
        );
        let logits = leaf(&grid("student_logits"));
        let asked = TopK::KlToTeacher {
            k,
            log_prob_min_clamp,
        };
        let columns = topk_columns(&logits, asked, Some(&targets))
            .unwrap()
            .expect("top-k columns");
        let kl = TopKKl::from_columns(&columns).unwrap();
        let log_prob = logits
            .log_softmax(-1, Kind::Double)
            .gather(-1, &labels.unsqueeze(-1), false)
            .squeeze_dim(-1);
        let inputs = DistillationInputs {
            log_prob: &log_prob,
            teacher: Teacher::TopK(&kl),
            old_log_prob: &old,
            response_mask: &mask,
            rollout_is_weights: None,
        };
        let term = distillation_term(&spec, &inputs, agg_mode, &agg).unwrap();
        let tol = 1e-6;
        assert_near(
            scalar(&term.loss),
            case["loss"].as_f64().unwrap(),
            tol,
            &what,
        );
        term.loss.backward();
        assert_close(
            &logits.grad(),
            &grid_of(&case["grad"], rows, width),
            tol,
            &what,
        );
        assert_metrics(&term.metrics, &case["metrics"], tol, &what);
    }
}

fn grid_of(v: &serde_json::Value, rows: i64, width: i64) -> Tensor {
    let flat: Vec<f64> = serde_json::from_value::<Vec<Vec<Vec<f64>>>>(v.clone())
        .unwrap()
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    Tensor::from_slice(&flat).view([rows, width, -1])
}
