//! Entropy from logits.
use tch::{Kind, Tensor};
use verlc_runtime::algo::entropy::{entropy_from_logits, entropy_loss};
use verlc_runtime::algo::{AggOptions, LossAggMode};

use crate::oracle;
use crate::support::{assert_close, assert_near, leaf, scalar, t2};

#[test]
fn entropy_matches_oracle() {
    let o = oracle::load("entropy");
    let x = leaf(o.get("logits"));
    let h = entropy_from_logits(&x).unwrap();
    assert_close(&h, o.get("entropy"), 1e-12, "entropy");
    (&h * o.get("cot")).sum(Kind::Double).backward();
    assert_close(&x.grad(), o.get("grad"), 1e-12, "gradient");
}

#[test]
fn entropy_hand_derived() {
    // Uniform over 4 → ln 4; any constant shift of the logits → the same; a near one-hot → ~0.
    let logits =
        Tensor::from_slice(&[0.0, 0.0, 0.0, 0.0, 5.0, 5.0, 5.0, 5.0, 100.0, 0.0, 0.0, 0.0])
            .view([1, 3, 4]);
    let h = entropy_from_logits(&logits).unwrap();
    assert_close(&h, &t2(&[&[4f64.ln(), 4f64.ln(), 0.0]]), 1e-12, "entropy");
    // entropy_loss aggregates like any loss: token-mean over the first two tokens = ln 4.
    let l = entropy_loss(
        &logits,
        &t2(&[&[1.0, 1.0, 0.0]]),
        LossAggMode::TokenMean,
        &AggOptions::default(),
    )
    .unwrap();
    assert_near(scalar(&l), 4f64.ln(), 1e-8, "entropy loss");
}
