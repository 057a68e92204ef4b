//! `verlc_runtime::algo::sft_loss` against verl 0.9.1's own `sft_loss` (workers/utils/losses.py, run
//! from its source by tests/oracle/verl_fn_oracle.py on jagged nested tensors): the loss and its
//! gradient with respect to the log-probs, for packed batches of one to four samples, several
//! data-parallel sizes and global token counts larger than the micro-batch's own.

use tch::{Kind, Tensor};
use verlc_runtime::algo::sft_loss::{loss_tokens, sft_loss};

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

/// verl 0.7.0's legacy SFT trainer's micro-batch loss (its `_compute_loss_and_backward`,
/// executed by the oracle on fixed logits of right-padded rows): the token mean of the
/// micro-batch over the micro-batch count, and its gradient with respect to the logits.
#[test]
fn legacy_sft_loss_matches_verl_0_7_0s_trainer() {
    use verlc_runtime::algo::sft_loss::sft_loss_legacy;
    let cases = verl_functions("sft_loss_legacy");
    let cases = cases.as_array().expect("cases");
    assert_eq!(cases.len(), 4);
    for case in cases {
        let ids: Vec<Vec<i64>> = serde_json::from_value(case["input_ids"].clone()).expect("ids");
        let mask: Vec<Vec<i64>> = serde_json::from_value(case["loss_mask"].clone()).expect("m");
        let logits: Vec<Vec<Vec<f64>>> =
            serde_json::from_value(case["logits"].clone()).expect("logits");
        let grad_want: Vec<Vec<Vec<f64>>> =
            serde_json::from_value(case["grad"].clone()).expect("grad");
        let micro = case["micro_batches"].as_u64().expect("micro") as usize;
        let (rows, width) = (ids.len() as i64, ids[0].len() as i64);
        let flat: Vec<f64> = logits.iter().flatten().flatten().copied().collect();
        let vocab = flat.len() as i64 / (rows * width);
        let logits = Tensor::from_slice(&flat)
            .reshape([rows, width, vocab])
            .set_requires_grad(true);
        let ids = Tensor::from_slice(&ids.concat()).reshape([rows, width]);
        let mask = Tensor::from_slice(&mask.concat()).reshape([rows, width]);
        // The runtime's layout: log p(token t | < t) for t >= 1, the mask on the same tokens.
        let log_probs = logits
            .narrow(1, 0, width - 1)
            .log_softmax(-1, Kind::Double)
            .gather(2, &ids.narrow(1, 1, width - 1).unsqueeze(-1), false)
            .squeeze_dim(-1);
        let shifted = mask.narrow(1, 1, width - 1);
        let tokens = loss_tokens(&shifted);
        let loss = sft_loss_legacy(&log_probs, &shifted, tokens, 1.0, micro).expect("loss");
        loss.backward();
        let (got, want) = (loss.double_value(&[]), case["loss"].as_f64().expect("loss"));
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "loss {got} vs verl's {want}"
        );
        let grad: Vec<f64> = Vec::try_from(logits.grad().flatten(0, -1)).expect("grad");
        let want: Vec<f64> = grad_want.iter().flatten().flatten().copied().collect();
        for (g, w) in grad.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6, "gradient {g} vs verl's {w}");
        }
    }
}
