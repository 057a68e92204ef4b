//! Tests of the Megatron stack: `verlc_runtime::optim::distrib` (buffer layout golden table),
//! `verlc_runtime::parallel::mappings` and `verlc_runtime::parallel::tp` (2 Gloo ranks), and `verlc_runtime::engine::megatron`
//! (TP=2, PP=2, DP=2 training against the single-process model), and expert parallelism at the
//! MoE block (`verlc_runtime::model::moe` over 2 ranks).
#[path = "../common/mod.rs"]
mod common;

mod engine;
mod expert_parallel;
mod layout;
mod mappings;
mod memory;
mod parallel_state;
mod parity;
mod rollout_reshard;
mod router_losses;
mod support;
mod vision;
mod vocab_parallel;
