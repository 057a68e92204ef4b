//! loss_agg_mode: oracle values, hand-derived values and the data-parallel properties.
use tch::{Kind, Tensor};
use verlc_runtime::algo::{AggOptions, AlgoError, AlgoRelease, LossAggMode, agg_loss};

use crate::oracle;
use crate::support::{assert_near, leaf, rng_lock, scalar, t2, to_vec};

const MODES: [LossAggMode; 4] = [
    LossAggMode::TokenMean,
    LossAggMode::SeqMeanTokenSum,
    LossAggMode::SeqMeanTokenMean,
    LossAggMode::SeqMeanTokenSumNorm,
];

/// Local normalisation as verl 0.7.0 aggregates (the oracle's formulas are 0.7's; 0.9.1's
/// own functions are release_semantics.rs's).
fn local_0_7() -> AggOptions {
    AggOptions {
        release: AlgoRelease::V0_7_0,
        ..AggOptions::default()
    }
}

fn global(meta: &serde_json::Value) -> AggOptions {
    let g = &meta["global"];
    AggOptions {
        dp_size: g["dp"].as_u64().unwrap() as usize,
        batch_num_tokens: g["n_tok"].as_f64(),
        global_batch_size: g["gbs"].as_f64(),
        loss_scale_factor: g["scale"].as_f64(),
        release: AlgoRelease::V0_7_0,
    }
}

#[test]
fn agg_modes_match_oracle() {
    let o = oracle::load("agg");
    let (loss, mask) = (o.get("loss"), o.get("mask"));
    for mode in MODES {
        for (scope, opts) in [("local", local_0_7()), ("global", global(&o.meta))] {
            let got = scalar(&agg_loss(loss, mask, mode, &opts).unwrap());
            assert_near(
                got,
                o.f64(&format!("{mode}/{scope}")),
                1e-12,
                &format!("{mode} {scope}"),
            );
        }
    }
}

#[test]
fn agg_modes_hand_derived() {
    // loss = [[1, 2, 3, 0], [4, 5, 6, 0], [7, 7, 7, 7]], mask = [[1, 1, 0, 0], [1, 0, 0, 0], 0].
    // token-mean:              (1 + 2 + 4)/3 = 7/3
    // seq-mean-token-sum:      ((1 + 2) + 4)/2 = 3.5   (the empty third sequence does not count)
    // seq-mean-token-mean:     (3/2 + 4/1)/2 = 2.75    (up to the 1e-8 in the token means)
    // seq-mean-token-sum-norm: 7/4 = 1.75              (S = response length 4)
    let loss = t2(&[
        &[1.0, 2.0, 3.0, 0.0],
        &[4.0, 5.0, 6.0, 0.0],
        &[7.0, 7.0, 7.0, 7.0],
    ]);
    let mask = t2(&[&[1.0, 1.0, 0.0, 0.0], &[1.0, 0.0, 0.0, 0.0], &[0.0; 4]]);
    let want = [7.0 / 3.0, 3.5, 2.75, 1.75];
    for (mode, w) in MODES.into_iter().zip(want) {
        let got = scalar(&agg_loss(&loss, &mask, mode, &local_0_7()).unwrap());
        assert_near(got, w, 1e-8, mode.as_str());
    }
    // verl 0.7.1 on: seq-mean-token-sum-norm is the per-sequence sum over the non-empty
    // sequences, over S: 7/2/4 = 0.875.
    let got = agg_loss(
        &loss,
        &mask,
        LossAggMode::SeqMeanTokenSumNorm,
        &AggOptions::default(),
    )
    .unwrap();
    assert_near(scalar(&got), 0.875, 1e-12, "seq-mean-token-sum-norm (0.9)");
    // With global info: D = 2, N = 14, B = 4, S = 10:
    // token-mean 2·7/14 = 1; seq-sum 2·7/4 = 3.5; seq-mean 2·5.5/4 = 2.75; sum-norm 7/10 = 0.7.
    let opts = AggOptions {
        dp_size: 2,
        batch_num_tokens: Some(14.0),
        global_batch_size: Some(4.0),
        loss_scale_factor: Some(10.0),
        release: AlgoRelease::V0_7_0,
    };
    for (mode, w) in MODES.into_iter().zip([1.0, 3.5, 2.75, 0.7]) {
        let got = scalar(&agg_loss(&loss, &mask, mode, &opts).unwrap());
        assert_near(got, w, 1e-8, &format!("{mode} global"));
    }
    // verl 0.7.1 on: 2·7/4/10 = 0.35.
    let newer = AggOptions {
        release: AlgoRelease::NEWEST,
        ..opts
    };
    let got = agg_loss(&loss, &mask, LossAggMode::SeqMeanTokenSumNorm, &newer).unwrap();
    assert_near(
        scalar(&got),
        0.35,
        1e-12,
        "seq-mean-token-sum-norm global (0.9)",
    );
}

/// With verl's global-batch information, averaging the per-rank losses over D ranks (what
/// data-parallel gradient averaging does) gives the loss of the whole batch: the ×D factor
/// cancels the averaging. verl 0.7.0's `seq-mean-token-sum-norm` has no ×D, so there the
/// average is 1/D of it; from 0.7.1 it is the whole batch's too.
#[test]
fn global_batch_info_makes_data_parallel_average_equal_the_full_batch() {
    let _rng = rng_lock();
    tch::manual_seed(3);
    let loss = Tensor::randn([8, 5], (Kind::Double, tch::Device::Cpu));
    let mask = Tensor::rand([8, 5], (Kind::Double, tch::Device::Cpu))
        .gt(0.4)
        .to_kind(Kind::Double);
    let _ = mask.get(2).fill_(0.0); // one empty sequence
    let n_tok = scalar(&mask.sum(Kind::Double));
    let n_seq = scalar(
        &mask
            .sum_dim_intlist(-1i64, false, Kind::Double)
            .gt(0.0)
            .sum(Kind::Double),
    );
    let d = 2;
    for release in [AlgoRelease::V0_7_0, AlgoRelease::NEWEST] {
        let opts = AggOptions {
            dp_size: d,
            batch_num_tokens: Some(n_tok),
            global_batch_size: Some(n_seq),
            loss_scale_factor: Some(5.0),
            release,
        };
        let whole = AggOptions {
            release,
            ..AggOptions::default()
        };
        for mode in MODES {
            let full = scalar(&agg_loss(&loss, &mask, mode, &whole).unwrap());
            let ranks: f64 = (0..d as i64)
                .map(|r| {
                    scalar(
                        &agg_loss(
                            &loss.narrow(0, 4 * r, 4),
                            &mask.narrow(0, 4 * r, 4),
                            mode,
                            &opts,
                        )
                        .unwrap(),
                    )
                })
                .sum::<f64>()
                / d as f64;
            let want =
                if mode == LossAggMode::SeqMeanTokenSumNorm && !release.seq_sum_norm_over_batch() {
                    full / d as f64
                } else {
                    full
                };
            assert_near(ranks, want, 1e-12, &format!("{mode} {release}"));
        }
    }
}

#[test]
fn masked_positions_never_count() {
    // Values (even NaN/inf) and gradients outside the mask do not matter.
    let loss = t2(&[&[1.0, f64::NAN, 3.0], &[f64::INFINITY, 5.0, 6.0]]);
    let mask = t2(&[&[1.0, 0.0, 1.0], &[0.0, 1.0, 1.0]]);
    for mode in MODES {
        let x = leaf(&loss);
        let got = agg_loss(&x, &mask, mode, &AggOptions::default()).unwrap();
        assert!(scalar(&got).is_finite(), "{mode}");
        got.backward();
        let g = to_vec(&x.grad());
        assert_eq!(
            (g[1], g[3]),
            (0.0, 0.0),
            "{mode}: gradient at masked positions"
        );
    }
}

#[test]
fn token_mean_gradient_is_uniform_over_valid_tokens() {
    // d/dℓ_{i,t} of token-mean is m_{i,t}/N: every valid token weighs the same, whatever its
    // sequence's length; seq-mean-token-mean weighs 1/(B·|y_i|).
    let mask = t2(&[&[1.0, 1.0, 1.0, 1.0], &[1.0, 0.0, 0.0, 0.0]]);
    let x = leaf(&Tensor::zeros([2, 4], (Kind::Double, tch::Device::Cpu)));
    agg_loss(&x, &mask, LossAggMode::TokenMean, &AggOptions::default())
        .unwrap()
        .backward();
    assert_eq!(
        to_vec(&x.grad()),
        vec![0.2, 0.2, 0.2, 0.2, 0.2, 0.0, 0.0, 0.0]
    );
    let x = leaf(&Tensor::zeros([2, 4], (Kind::Double, tch::Device::Cpu)));
    agg_loss(
        &x,
        &mask,
        LossAggMode::SeqMeanTokenMean,
        &AggOptions::default(),
    )
    .unwrap()
    .backward();
    let g = to_vec(&x.grad());
    assert_near(g[0], 0.125, 1e-8, "long sequence token");
    assert_near(g[4], 0.5, 1e-8, "short sequence token");
}

#[test]
fn empty_mask_gives_zero_not_nan() {
    let loss = t2(&[&[1.0, 2.0]]);
    let mask = t2(&[&[0.0, 0.0]]);
    for mode in MODES {
        assert_eq!(
            scalar(&agg_loss(&loss, &mask, mode, &AggOptions::default()).unwrap()),
            0.0,
            "{mode}"
        );
    }
}

#[test]
fn bad_arguments_are_errors() {
    let loss = t2(&[&[1.0, 2.0]]);
    let mask = t2(&[&[1.0, 1.0]]);
    let zero_dp = AggOptions {
        dp_size: 0,
        ..AggOptions::default()
    };
    assert!(matches!(
        agg_loss(&loss, &mask, LossAggMode::TokenMean, &zero_dp),
        Err(AlgoError::Config(_))
    ));
    let neg = AggOptions {
        batch_num_tokens: Some(-1.0),
        ..AggOptions::default()
    };
    assert!(matches!(
        agg_loss(&loss, &mask, LossAggMode::TokenMean, &neg),
        Err(AlgoError::Config(_))
    ));
    let err = agg_loss(
        &loss,
        &t2(&[&[1.0]]),
        LossAggMode::TokenMean,
        &AggOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            AlgoError::Shape {
                name: "loss_mask",
                ..
            }
        ),
        "{err}"
    );
}
