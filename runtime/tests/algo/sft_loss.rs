//! `runtime::algo::sft_loss` against verl 0.9.1's own `sft_loss` (workers/utils/losses.py, run
//! from its source by tests/oracle/verl_fn_oracle.py on jagged nested tensors): the loss and its
//! gradient with respect to the log-probs, for packed batches of one to four samples, several
//! data-parallel sizes and global token counts larger than the micro-batch's own.

use runtime::algo::sft_loss::{loss_tokens, sft_loss};
use tch::{Kind, Tensor};

use crate::oracle::verl_functions;

#[test]
fn sft_loss_matches_verls_on_packed_batches() {
    let cases = verl_functions("sft_loss_0_9");
    let cases = cases.as_array().expect("cases");
    assert_eq!(cases.len(), 4);
    for case in cases {
        let lp: Vec<f64> = serde_json::from_value(case["log_probs"].clone()).expect("lp");
        let mask: Vec<i64> = serde_json::from_value(case["loss_mask"].clone()).expect("mask");
        let grad_want: Vec<f64> = serde_json::from_value(case["grad"].clone()).expect("grad");
        let n = case["batch_num_tokens"].as_f64().expect("tokens");
        let dp = case["dp_size"].as_u64().expect("dp") as usize;
        let lp = Tensor::from_slice(&lp).set_requires_grad(true);
        let mask = Tensor::from_slice(&mask);
        let loss = sft_loss(&lp, &mask, n, dp);
        loss.backward();
        let want = case["loss"].as_f64().expect("loss");
        let got = loss.double_value(&[]);
        assert!(
            (got - want).abs() <= 1e-12 * want.abs().max(1.0),
            "{case}: loss {got} vs {want}"
        );
        let grad: Vec<f64> = Vec::try_from(lp.grad().to_kind(Kind::Double)).expect("grad");
        for (g, w) in grad.iter().zip(&grad_want) {
            assert!(
                (g - w).abs() <= 1e-12,
                "{case}: grad {grad:?} vs {grad_want:?}"
            );
        }
    }
}

/// Two micro-batches of one step, each divided by the step's token count, add up to the loss
/// of the step as one batch: the micro-batch size does not change the update.
#[test]
fn micro_batches_of_a_step_add_up_to_the_whole() {
    let lp = Tensor::from_slice(&[-0.5f64, -1.0, -0.2, -2.0, -0.7, -0.1, -1.5, -0.3]);
    let mask = Tensor::from_slice(&[0i64, 1, 1, 0, 0, 1, 1, 1]);
    let (a, b) = (lp.narrow(0, 0, 4), lp.narrow(0, 4, 4));
    let (ma, mb) = (mask.narrow(0, 0, 4), mask.narrow(0, 4, 4));
    let n = loss_tokens(&mask);
    assert_eq!(n, 5.0);
    let whole = sft_loss(&lp, &mask, n, 1).double_value(&[]);
    let parts =
        sft_loss(&a, &ma, n, 1).double_value(&[]) + sft_loss(&b, &mb, n, 1).double_value(&[]);
    assert!((whole - parts).abs() < 1e-12, "{whole} vs {parts}");
}
