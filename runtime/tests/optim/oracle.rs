//! Runs tests/oracle/optim_oracle.py once and loads its outputs.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tch::{Kind, Tensor};

fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = crate::common::temp_dir("optim_oracle");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/optim_oracle.py");
        let py = crate::common::python();
        let status =
            crate::common::python::run_script(&py, &script, &[&out], &[("OMP_NUM_THREADS", "1")]);
        assert!(status.success(), "oracle failed: {status}");
        out
    })
}

pub fn tensors(case: &str) -> HashMap<String, Tensor> {
    let path = dir().join(format!("{case}.safetensors"));
    Tensor::read_safetensors(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect()
}

pub fn json(case: &str) -> serde_json::Value {
    let path = dir().join(format!("{case}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

pub fn get<'a>(m: &'a HashMap<String, Tensor>, key: &str) -> &'a Tensor {
    m.get(key)
        .unwrap_or_else(|| panic!("oracle has no tensor {key}"))
}

/// Largest |a - b| / max(|b|, 1e-3), elementwise, in f64.
pub fn max_rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_kind(Kind::Double);
    let b = b.to_kind(Kind::Double);
    ((&a - &b).abs() / b.abs().clamp_min(1e-3))
        .max()
        .double_value(&[])
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}
