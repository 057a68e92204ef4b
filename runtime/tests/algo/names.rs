//! The name enums use verl's exact spellings (the values of `algorithm.adv_estimator`,
//! `actor.policy_loss.loss_mode`, `actor.loss_agg_mode`).
use verlc_runtime::algo::{AdvEstimator, LossAggMode, PolicyLossMode};
use verlc_spec::UnknownName;

fn round_trip<T>(all: &[T], spellings: &[&str])
where
    T: std::str::FromStr<Err = UnknownName>
        + std::fmt::Display
        + serde::Serialize
        + PartialEq
        + std::fmt::Debug
        + Copy,
{
    let printed: Vec<String> = all.iter().map(|v| v.to_string()).collect();
    assert_eq!(printed, spellings);
    for (v, s) in all.iter().zip(spellings) {
        assert_eq!(&s.parse::<T>().unwrap(), v);
        assert_eq!(
            serde_json::to_value(v).unwrap(),
            serde_json::Value::String((*s).to_owned())
        );
    }
}

#[test]
fn adv_estimator_names() {
    round_trip(
        AdvEstimator::ALL,
        &[
            "gae",
            "grpo",
            "grpo_vectorized",
            "grpo_passk",
            "reinforce_plus_plus",
            "reinforce_plus_plus_baseline",
            "rloo",
            "rloo_vectorized",
            "opo",
            "remax",
            "gpg",
            "optimal_token_baseline",
            "tir_optimal_token_baseline",
            "gdpo",
        ],
    );
    let err = "gpro".parse::<AdvEstimator>().unwrap_err();
    assert!(err.to_string().contains("grpo_vectorized"), "{err}");
}

#[test]
fn policy_loss_mode_names() {
    round_trip(
        PolicyLossMode::ALL,
        &[
            "vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo", "dppo_tv",
            "dppo_kl", "dro",
        ],
    );
    assert!("bypass_mode".parse::<PolicyLossMode>().is_err());
}

#[test]
fn loss_agg_mode_names() {
    round_trip(
        LossAggMode::ALL,
        &[
            "token-mean",
            "seq-mean-token-sum",
            "seq-mean-token-mean",
            "seq-mean-token-sum-norm",
            "token-sum",
        ],
    );
}
