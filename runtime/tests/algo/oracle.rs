//! Runs tests/oracle/algo_oracle.py once and loads its outputs.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tch::Tensor;

fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = crate::common::temp_dir("algo_oracle");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/algo_oracle.py");
        let py = crate::common::python();
        assert!(
            py.exists(),
            "the algo oracle needs the project venv's python at {} (with torch): run scripts/setup first \
             (or set VERLC_PYTHON)",
            py.display()
        );
        let status =
            crate::common::python::run_script(&py, &script, &[&out], &[("OMP_NUM_THREADS", "1")]);
        assert!(status.success(), "algo oracle failed ({status}); is torch installed? run scripts/setup");
        out
    })
}

/// The tensors and the JSON parameters of one oracle group.
pub struct Group {
    tensors: HashMap<String, Tensor>,
    pub meta: serde_json::Value,
}

impl Group {
    pub fn get(&self, key: &str) -> &Tensor {
        self.tensors
            .get(key)
            .unwrap_or_else(|| panic!("oracle has no tensor {key}"))
    }

    pub fn f64(&self, key: &str) -> f64 {
        self.get(key).double_value(&[])
    }
}

pub fn load(group: &str) -> Group {
    let st = dir().join(format!("{group}.safetensors"));
    let tensors = Tensor::read_safetensors(&st)
        .unwrap_or_else(|e| panic!("{}: {e}", st.display()))
        .into_iter()
        .collect();
    let js = dir().join(format!("{group}.json"));
    let meta = serde_json::from_str(&std::fs::read_to_string(&js).unwrap()).unwrap();
    Group { tensors, meta }
}

/// One output file (`pf_ppo`, `dynamic_bsz`, `rollout_corr`, `bypass`) of
/// tests/oracle/verl_fn_oracle.py, which runs verl's own functions from the installed verl
/// source; the script runs once per test binary.
pub fn verl_functions(name: &str) -> serde_json::Value {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let out = crate::common::temp_dir("verl_fn_oracle");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/verl_fn_oracle.py");
        let status = crate::common::python::run_script(
            &crate::common::python(),
            &script,
            &[&out],
            &[("OMP_NUM_THREADS", "1")],
        );
        assert!(status.success(), "verl function oracle failed: {status}");
        out
    });
    let file = dir.join(format!("{name}.json"));
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}
