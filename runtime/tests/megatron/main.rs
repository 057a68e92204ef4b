//! Tests of the Megatron stack: `runtime::optim::distrib` (buffer layout golden table),
//! `runtime::dist::mappings` and `runtime::tp` (2 Gloo ranks), and `runtime::megatron`
//! (TP=2, PP=2, DP=2 training against the single-process model).
#[path = "../common/mod.rs"]
mod common;

mod engine;
mod layout;
mod mappings;
mod memory;
mod parallel_state;
mod parity;
mod rollout_reshard;
mod support;
mod vocab_parallel;
