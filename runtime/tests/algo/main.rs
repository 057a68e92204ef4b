//! Tests of `verlc_runtime::algo` (mirrors runtime/src/algo/). Expected values are either derived by
//! hand (derivation in a comment next to the numbers) or computed by an independent PyTorch
//! oracle in the venv (tests/oracle/algo_oracle.py, run once per test binary), plus properties.
#[path = "../common/mod.rs"]
mod common;

mod advantage;
mod agg;
mod distillation;
mod dynamic_bsz;
mod entropy;
mod kl;
mod kl_ctrl;
mod names;
mod oracle;
mod pf_ppo;
mod policy_loss;
mod rejection;
mod release_semantics;
mod rollout_correction;
mod sft_loss;
mod support;
mod value_loss;
