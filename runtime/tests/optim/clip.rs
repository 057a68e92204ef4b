//! Grad norm, clipping and zero counting against torch.nn.utils.clip_grad_norm_.
use tch::Tensor;
use verlc_runtime::optim::clip::{self, NormType};

use crate::oracle::{self, get, max_abs_diff};

const NAMES: [&str; 3] = ["w1", "b1", "w2"];

fn check(case: &str, norm: NormType) {
    let o = oracle::tensors("clip");
    let j = oracle::json("clip");
    let want_norm = j[case]["total_norm"].as_f64().unwrap();
    let max_norm = j[case]["max_norm"].as_f64().unwrap();
    let grads: Vec<Tensor> = NAMES
        .iter()
        .map(|n| get(&o, &format!("{case}.in.{n}")).copy())
        .collect();
    let total = clip::clip_grad_norm_fp32(&grads, max_norm, norm, None).unwrap();
    assert!(
        ((total - want_norm) / want_norm).abs() < 1e-6,
        "{case}: norm {total} vs torch {want_norm}"
    );
    for (g, n) in grads.iter().zip(NAMES) {
        let want = get(&o, &format!("{case}.out.{n}"));
        let d = max_abs_diff(g, want);
        assert!(
            d <= 1e-7 * want.abs().max().double_value(&[]).max(1.0),
            "{case}.{n}: {d:e}"
        );
    }
    let zeros = clip::count_zeros_fp32(&grads, None).unwrap();
    assert_eq!(zeros, j[case]["num_zeros"].as_u64().unwrap());
}

#[test]
fn l2_clip_matches_torch() {
    check("l2", NormType::L2);
}

#[test]
fn small_norm_is_left_alone() {
    check("noop", NormType::L2);
}

#[test]
fn inf_norm_matches_torch() {
    check("inf", NormType::Inf);
}

#[test]
fn clip_coefficient_is_megatrons() {
    // coeff = max_norm / (norm + 1e-6), applied only below 1.
    let g = Tensor::from_slice(&[3.0f32, 4.0]);
    let total = clip::grad_norm_fp32(std::slice::from_ref(&g), NormType::L2, None).unwrap();
    assert_eq!(total, 5.0);
    let coeff = clip::clip_grad_by_total_norm_fp32(std::slice::from_ref(&g), 1.0, total).unwrap();
    assert_eq!(coeff, 1.0 / (5.0 + 1e-6));
    assert_eq!(
        Vec::<f32>::try_from(&g).unwrap(),
        vec![(3.0 * coeff) as f32, (4.0 * coeff) as f32]
    );
    assert_eq!(
        clip::clip_grad_by_total_norm_fp32(std::slice::from_ref(&g), 10.0, 1.0).unwrap(),
        1.0
    );
}

#[test]
fn zeros_and_empty_lists() {
    let g = Tensor::from_slice(&[0.0f32, 1.0, 0.0, -2.0]);
    assert_eq!(
        clip::count_zeros_fp32(
            &[g.shallow_clone(), Tensor::zeros([3], tch::kind::FLOAT_CPU)],
            None
        )
        .unwrap(),
        5
    );
    assert_eq!(clip::grad_norm_fp32(&[], NormType::L2, None).unwrap(), 0.0);
    assert_eq!(
        clip::grad_norm_fp32(&[g], NormType::P(1.0), None).unwrap(),
        3.0
    );
}
