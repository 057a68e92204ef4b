//! The clipped value loss.
use verlc_runtime::algo::{AggOptions, LossAggMode, compute_value_loss};

use crate::oracle;
use crate::support::{assert_close, assert_near, leaf, scalar, t2};

const MODES: [LossAggMode; 4] = [
    LossAggMode::TokenMean,
    LossAggMode::SeqMeanTokenSum,
    LossAggMode::SeqMeanTokenMean,
    LossAggMode::SeqMeanTokenSumNorm,
];

#[test]
fn value_loss_matches_oracle() {
    let o = oracle::load("value");
    let c = o.meta["cliprange_value"].as_f64().unwrap();
    let g = &o.meta["global"];
    let global = AggOptions {
        dp_size: g["dp"].as_u64().unwrap() as usize,
        batch_num_tokens: g["n_tok"].as_f64(),
        global_batch_size: g["gbs"].as_f64(),
        loss_scale_factor: g["scale"].as_f64(),
        release: verlc_runtime::algo::AlgoRelease::V0_7_0,
    };
    for mode in MODES {
        // The oracle's formulas are verl 0.7.0's.
        let local = AggOptions {
            release: verlc_runtime::algo::AlgoRelease::V0_7_0,
            ..AggOptions::default()
        };
        for (scope, agg) in [("local", local), ("global", global)] {
            let v = leaf(o.get("vpreds"));
            let out = compute_value_loss(
                &v,
                o.get("returns"),
                o.get("values"),
                o.get("mask"),
                c,
                mode,
                &agg,
            )
            .unwrap();
            let key = format!("{mode}/{scope}");
            assert_near(
                scalar(&out.loss),
                o.f64(&format!("{key}/loss")),
                1e-12,
                &key,
            );
            assert_near(
                scalar(&out.vf_clipfrac),
                o.f64(&format!("{key}/clipfrac")),
                1e-12,
                &key,
            );
            out.loss.backward();
            assert_close(&v.grad(), o.get(&format!("{key}/grad")), 1e-12, &key);
        }
    }
}

#[test]
fn value_loss_hand_derived() {
    // Token 0: v̂ = 1.5, V_old = 1, R = 2, c = 0.2 → v̂_clip = 1.2; (v̂ − R)² = 0.25,
    // (v̂_clip − R)² = 0.64 → max 0.64 (clipped, no gradient: v̂_clip is constant in v̂).
    // Token 1: v̂ = 1.1, V_old = 1, R = 0 → inside the clip; both 1.21, gradient of ½·(v̂ − R)²/2
    // per token-mean over 2 tokens = (v̂ − R)/2 = 0.55.
    // loss = ½·(0.64 + 1.21)/2 = 0.4625; clipfrac = 1/2.
    let v = leaf(&t2(&[&[1.5, 1.1]]));
    let out = compute_value_loss(
        &v,
        &t2(&[&[2.0, 0.0]]),
        &t2(&[&[1.0, 1.0]]),
        &t2(&[&[1.0, 1.0]]),
        0.2,
        LossAggMode::TokenMean,
        &AggOptions::default(),
    )
    .unwrap();
    assert_near(scalar(&out.loss), 0.4625, 1e-12, "loss");
    assert_near(scalar(&out.vf_clipfrac), 0.5, 1e-8, "clipfrac");
    out.loss.backward();
    assert_close(&v.grad(), &t2(&[&[0.0, 0.55]]), 1e-12, "grad");
    assert!(
        compute_value_loss(
            &v,
            &v,
            &v,
            &v,
            -1.0,
            LossAggMode::TokenMean,
            &AggOptions::default()
        )
        .is_err()
    );
}
