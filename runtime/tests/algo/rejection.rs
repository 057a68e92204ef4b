//! verl 0.9's rejection sampling against verl 0.9.1's own `compute_rollout_rejection_mask`
//! (run from its source by tests/oracle/verl_fn_oracle.py): for every option, alone and
//! combined, with each threshold form, the new response mask and every metric, on log-ratios
//! with outliers (one beyond the ±20 safety bound) and a row without valid tokens.
use verlc_runtime::algo::KlKind;
use verlc_runtime::algo::rejection::{RsAggregate, RsCriterion, rejection_mask};

use crate::oracle;
use crate::support::{assert_close, assert_near, json_matrix};

fn criterion(name: &str, bounds: &serde_json::Value) -> RsCriterion {
    let (aggregate, estimator) = name.rsplit_once('_').expect("option");
    RsCriterion {
        name: name.to_owned(),
        aggregate: match aggregate {
            "token" => RsAggregate::Token,
            "seq_sum" => RsAggregate::SeqSum,
            "seq_mean" => RsAggregate::SeqMean,
            "seq_max" => RsAggregate::SeqMax,
            other => panic!("{other}"),
        },
        estimator: KlKind::from_verl_name(estimator).expect("estimator"),
        lower: bounds[0].as_f64(),
        upper: bounds[1].as_f64().expect("upper"),
    }
}

#[test]
fn rejection_sampling_is_verl_0_9s() {
    let o = oracle::verl_functions("rejection_0_9");
    let (log_ratio, mask) = (json_matrix(&o["log_ratio"]), json_matrix(&o["mask"]));
    let cases = o["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 14);
    for case in cases {
        let names: Vec<&str> = case["options"]
            .as_array()
            .expect("options")
            .iter()
            .map(|v| v.as_str().expect("name"))
            .collect();
        let criteria: Vec<RsCriterion> = names
            .iter()
            .zip(case["bounds"].as_array().expect("bounds"))
            .map(|(n, b)| criterion(n, b))
            .collect();
        let what = names.join(",");
        let (keep, metrics) = rejection_mask(&log_ratio, &mask, &criteria).unwrap();
        assert_close(&(&mask * &keep), &json_matrix(&case["mask"]), 0.0, &what);
        let want = case["metrics"].as_object().expect("metrics");
        assert_eq!(metrics.len(), want.len(), "{what}: {metrics:?} vs {want:?}");
        for (name, value) in &metrics {
            let theirs = want[name.as_str()]
                .as_f64()
                .unwrap_or_else(|| panic!("{what}: {name} missing"));
            assert_near(*value, theirs, 1e-9, &format!("{what} {name}"));
        }
    }
}
