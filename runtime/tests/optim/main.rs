//! Tests of `verlc_runtime::optim` (mirrors runtime/src/optim/). Parity tests use PyTorch in the
//! venv as the oracle (tests/oracle/optim_oracle.py, run once per test binary).
#[path = "../common/mod.rs"]
mod common;

mod clip;
mod optimizer;
mod oracle;
mod param_groups;
mod parity;
mod scaler;
mod sched;
mod state;
