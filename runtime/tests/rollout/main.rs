//! Tests of `verlc_runtime::rollout` (mirrors runtime/src/rollout/). Greedy parity uses transformers'
//! `generate()` in the venv as the oracle (tests/oracle/model_oracle.py, run once and cached).
#[path = "../oracle/run.rs"]
mod oracle;

mod agent;
mod engine;
mod logprob;
mod sampling;
mod tools;
mod vllm;
