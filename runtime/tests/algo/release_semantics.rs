//! The functions whose results changed between verl releases run as the release a config was
//! judged against runs them: `seq-mean-token-sum-norm` (and agg_loss's refusal of a
//! data-parallel loss without the global counts), the gspo loss's aggregation,
//! reinforce_plus_plus's returns and grpo_vectorized's group std, each against verl 0.7.0's and
//! 0.9.1's own functions (tests/oracle/verl_fn_oracle.py runs them from each release's source)
//! on inputs with holes in the mask, an empty row, singleton groups and near-equal scores.
use tch::{Kind, Tensor};
use verlc_runtime::algo::advantage::{AdvEstimator, AdvantageConfig, AdvantageInputs, GroupIndex};
use verlc_runtime::algo::{
    AggOptions, AlgoRelease, LossAggMode, PolicyLossConfig, PolicyLossInputs, PolicyLossMode,
    agg_loss, compute_advantage, compute_policy_loss,
};

use crate::oracle;
use crate::support::{assert_close, assert_near, json_matrix, leaf, scalar};

const RELEASES: [(&str, AlgoRelease); 2] = [
    ("0.7.0", AlgoRelease::V0_7_0),
    ("0.9.1", AlgoRelease::NEWEST),
];

fn oracle() -> serde_json::Value {
    oracle::verl_functions("release_semantics")
}

#[test]
fn seq_mean_token_sum_norm_is_each_releases() {
    let o = oracle();
    let (loss, mask) = (json_matrix(&o["loss_mat"]), json_matrix(&o["mask"]));
    let g = &o["global"];
    for (label, release) in RELEASES {
        let want = &o["releases"][label]["seq_sum_norm"];
        let local = AggOptions {
            release,
            ..AggOptions::default()
        };
        let global = AggOptions {
            dp_size: g["dp_size"].as_u64().expect("dp") as usize,
            batch_num_tokens: g["batch_num_tokens"].as_f64(),
            global_batch_size: g["global_batch_size"].as_f64(),
            loss_scale_factor: g["loss_scale_factor"].as_f64(),
            release,
        };
        for (scope, opts) in [("local", local), ("global", global)] {
            let got = agg_loss(&loss, &mask, LossAggMode::SeqMeanTokenSumNorm, &opts).unwrap();
            let theirs = want[scope].as_f64().expect("a value");
            assert_near(scalar(&got), theirs, 1e-12, &format!("{label} {scope}"));
        }
    }
    // verl 0.7.1 on refuses a data-parallel loss without the global batch's counts (0.7.0
    // normalised locally).
    let dp2 = |release| AggOptions {
        dp_size: 2,
        release,
        ..AggOptions::default()
    };
    for mode in [LossAggMode::TokenMean, LossAggMode::SeqMeanTokenSumNorm] {
        assert!(agg_loss(&loss, &mask, mode, &dp2(AlgoRelease::NEWEST)).is_err());
        assert!(agg_loss(&loss, &mask, mode, &dp2(AlgoRelease::V0_7_0)).is_ok());
    }
    // A micro-batch without valid tokens has nothing to normalise: no refusal.
    let empty = mask.zeros_like();
    assert!(
        agg_loss(
            &loss,
            &empty,
            LossAggMode::TokenMean,
            &dp2(AlgoRelease::NEWEST)
        )
        .is_ok()
    );
}

#[test]
fn gspo_aggregates_as_each_release_does() {
    let o = oracle();
    let m = |k: &str| json_matrix(&o[k]);
    let (old, adv, mask) = (m("old_log_prob"), m("advantages"), m("mask"));
    for (label, release) in RELEASES {
        let cfg = PolicyLossConfig {
            clip_ratio: 0.2,
            clip_ratio_low: Some(0.2),
            clip_ratio_high: Some(0.2),
            release,
            ..PolicyLossConfig::default()
        };
        for mode in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] {
            let want = &o["releases"][label]["gspo"][mode];
            let agg_mode: LossAggMode = mode.parse().unwrap();
            let lp = leaf(&m("log_prob"));
            let inputs = PolicyLossInputs::new(&old, &lp, &adv, &mask);
            let out = compute_policy_loss(
                PolicyLossMode::Gspo,
                &inputs,
                &cfg,
                agg_mode,
                &AggOptions::default(),
            )
            .unwrap();
            let what = format!("{label} gspo {mode}");
            assert_near(
                scalar(&out.loss),
                want["loss"].as_f64().unwrap(),
                1e-10,
                &what,
            );
            out.loss.backward();
            assert_close(&lp.grad(), &json_matrix(&want["grad"]), 1e-10, &what);
        }
    }
}

#[test]
fn reinforce_plus_plus_returns_are_each_releases() {
    let o = oracle();
    let (rewards, mask) = (json_matrix(&o["rewards"]), json_matrix(&o["mask"]));
    for (label, release) in RELEASES {
        let cfg = AdvantageConfig {
            gamma: 1.0,
            release,
            ..AdvantageConfig::default()
        };
        let out = compute_advantage(
            AdvEstimator::ReinforcePlusPlus,
            &AdvantageInputs::new(&rewards, &mask),
            &cfg,
        )
        .unwrap();
        let want = &o["releases"][label];
        let what = format!("{label} reinforce_plus_plus");
        assert_close(
            &out.returns,
            &json_matrix(&want["rpp_returns"]),
            1e-12,
            &what,
        );
        assert_close(
            &out.advantages,
            &json_matrix(&want["rpp_advantages"]),
            1e-9,
            &what,
        );
    }
}

#[test]
fn grpo_vectorized_std_is_each_releases() {
    let o = oracle();
    let scores: Vec<f64> = o["scores"]
        .as_array()
        .expect("scores")
        .iter()
        .map(|v| v.as_f64().expect("a score"))
        .collect();
    let groups: Vec<i64> = o["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|v| v.as_i64().expect("a group"))
        .collect();
    let n = scores.len() as i64;
    // The score on the last of two tokens, as verl's token-level rewards hold it.
    let rewards = Tensor::zeros([n, 2], (Kind::Double, tch::Device::Cpu));
    rewards
        .select(1, 1)
        .copy_(&Tensor::from_slice(&scores).to_kind(Kind::Double));
    let mask = Tensor::ones([n, 2], (Kind::Double, tch::Device::Cpu));
    let index = GroupIndex::from_ids(&groups);
    for (label, release) in RELEASES {
        let cfg = AdvantageConfig {
            release,
            ..AdvantageConfig::default()
        };
        let out = compute_advantage(
            AdvEstimator::GrpoVectorized,
            &AdvantageInputs::new(&rewards, &mask).index(&index),
            &cfg,
        )
        .unwrap();
        let want: Vec<f64> = o["releases"][label]["grpo_vectorized"]
            .as_array()
            .expect("advantages")
            .iter()
            .map(|v| v.as_f64().expect("a value"))
            .collect();
        // verl 0.9.1's group statistics run in float32: its near-equal pairs carry its rounding.
        let got = out.advantages.select(1, 1);
        assert_close(
            &got,
            &Tensor::from_slice(&want).to_kind(Kind::Double),
            2e-3,
            &format!("{label} grpo_vectorized"),
        );
    }
    // Scores 1.0 and 1.001: verl 0.7's variance floor shrinks them to about ±0.4995, 0.9's
    // unfloored std gives about ±0.7060.
    let pair = |release| {
        let cfg = AdvantageConfig {
            release,
            ..AdvantageConfig::default()
        };
        let out = compute_advantage(
            AdvEstimator::GrpoVectorized,
            &AdvantageInputs::new(&rewards, &mask).index(&index),
            &cfg,
        )
        .unwrap();
        out.advantages.double_value(&[1, 1])
    };
    assert_near(pair(AlgoRelease::V0_7_0), 0.4995, 1e-3, "0.7.0 floor");
    assert_near(pair(AlgoRelease::NEWEST), 0.7060, 1e-3, "0.9.1 no floor");
}
