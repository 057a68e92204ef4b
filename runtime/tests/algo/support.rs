//! Small helpers: building tensors from literals and comparing with tolerances.
use std::sync::{Mutex, MutexGuard};

use tch::{Kind, Tensor};

/// A `[rows, cols]` f64 tensor.
pub fn t2(rows: &[&[f64]]) -> Tensor {
    let cols = rows.first().map_or(0, |r| r.len());
    let flat: Vec<f64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_slice(&flat).view([rows.len() as i64, cols as i64])
}

/// A 2-D f64 tensor from a JSON list of rows (the verl-function oracle's outputs).
pub fn json_matrix(v: &serde_json::Value) -> Tensor {
    let rows: Vec<Vec<f64>> = serde_json::from_value(v.clone()).expect("matrix");
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    Tensor::from_slice(&flat).view([rows.len() as i64, -1])
}

/// A 1-D f64 tensor.
pub fn t1(v: &[f64]) -> Tensor {
    Tensor::from_slice(v)
}

pub fn scalar(t: &Tensor) -> f64 {
    t.to_kind(Kind::Double).double_value(&[])
}

pub fn to_vec(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.to_kind(Kind::Double).contiguous().view([-1i64])).unwrap()
}

/// Asserts equal shapes and `|got − want| ≤ tol·(1 + |want|)` elementwise.
#[track_caller]
pub fn assert_close(got: &Tensor, want: &Tensor, tol: f64, what: &str) {
    assert_eq!(got.size(), want.size(), "{what}: shape");
    let (g, w) = (to_vec(got), to_vec(want));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}: element {i}: got {a}, want {b}\n got: {g:?}\nwant: {w:?}"
        );
    }
}

#[track_caller]
pub fn assert_near(got: f64, want: f64, tol: f64, what: &str) {
    assert!(
        (got - want).abs() <= tol * (1.0 + want.abs()),
        "{what}: got {got}, want {want}"
    );
}

/// A leaf copy of `t` that requires grad.
pub fn leaf(t: &Tensor) -> Tensor {
    t.detach().copy().set_requires_grad(true)
}

/// Serialises the tests that seed or draw from libtorch's global generator (tests run on
/// parallel threads; clip_cov's random draw uses that generator).
pub fn rng_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
