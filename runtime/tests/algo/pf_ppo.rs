//! PF-PPO's resampling weights equal the weights verl 0.7.0's own
//! `compute_pf_ppo_reweight_data` hands to `torch.multinomial` (run from the installed verl
//! source by tests/oracle/verl_fn_oracle.py), for every reweight method, with ties at the
//! highest and lowest scores; verl's draw only picks rows of positive weight, as ours does.

use tch::Tensor;
use verlc_runtime::algo::pf_ppo::{pf_ppo_sample, pf_ppo_weights};
use verlc_runtime::rng::Rng;
use verlc_spec::trainer::PfPpoMethod;

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

#[test]
fn pf_ppo_weights_are_verls() {
    let o = crate::oracle::verl_functions("pf_ppo");
    let rows: Vec<Vec<f64>> =
        serde_json::from_value(o["token_level_scores"].clone()).expect("scores");
    let flat: Vec<f32> = rows.iter().flatten().map(|&x| x as f32).collect();
    let scores = Tensor::from_slice(&flat)
        .view([rows.len() as i64, -1])
        .sum_dim_intlist(-1i64, false, tch::Kind::Float);
    for (name, want) in o["methods"].as_object().expect("methods") {
        let (method, pow) = name.split_once(':').expect("method:pow");
        let m = match method {
            "pow" => PfPpoMethod::Pow,
            "max_min" => PfPpoMethod::MaxMin,
            "max_random" => PfPpoMethod::MaxRandom,
            other => panic!("unknown method {other}"),
        };
        let w = pf_ppo_weights(&scores, m, pow.parse().expect("pow")).expect("weights");
        let ours = Vec::<f64>::try_from(w.to_kind(tch::Kind::Double)).expect("weights");
        let theirs = floats(&want["weights"]);
        for (a, b) in ours.iter().zip(&theirs) {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1e-8),
                "{name}: {ours:?} vs verl {theirs:?}"
            );
        }
        assert!(want["uids_follow_rows"].as_bool().expect("bool"));
        // Rows of (almost) zero weight are never drawn, by verl or by us.
        let drawn = pf_ppo_sample(&w, 2000, &mut Rng::new(1)).expect("sample");
        for r in floats(&want["resampled_rows"])
            .iter()
            .map(|&r| r as usize)
            .chain(drawn.iter().map(|&r| r as usize))
        {
            assert!(
                theirs[r] > 1e-6,
                "{name}: row {r} of weight {} drawn",
                theirs[r]
            );
        }
    }
}
