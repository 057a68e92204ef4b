//! Tests of `verlc_runtime::model` (mirrors runtime/src/model/). Parity tests use Hugging Face
//! transformers in the venv as the oracle (tests/oracle/model_oracle.py, run once and cached).
#[path = "../oracle/run.rs"]
mod oracle;

mod builtin;
mod cache;
mod checkpoint;
mod errors;
mod lora;
mod moe;
mod parity;
mod qwen3_5;
mod reward;
mod vision;
