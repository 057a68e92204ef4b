//! Dynamic batch size: the micro-batches (rows and order) equal those of verl 0.7.0's own
//! `rearrange_micro_batches` (run from the installed source by verl_fn_oracle.py) for seeded
//! lengths and budgets, ties included.

use verlc_runtime::engine::EngineError;
use verlc_runtime::engine::micro::dynamic_parts;

#[test]
fn dynamic_micro_batches_are_verls() {
    let cases: Vec<serde_json::Value> =
        serde_json::from_value(crate::oracle::verl_functions("dynamic_bsz")).expect("json");
    assert!(cases.len() >= 5);
    for c in cases {
        let lengths: Vec<i64> = serde_json::from_value(c["lengths"].clone()).expect("lengths");
        let budget = c["budget"].as_u64().expect("budget") as usize;
        let want: Vec<Vec<i64>> = serde_json::from_value(c["parts"].clone()).expect("parts");
        let got = dynamic_parts(&lengths, budget, Ok::<usize, EngineError>).expect("parts");
        assert_eq!(got, want, "lengths {lengths:?}, budget {budget}");
    }
    // More ranks' micro-batches than rows cannot be formed.
    assert!(dynamic_parts(&[3, 4], 100, |_| Ok(3)).is_err());
}
