//! Integration tests of the trainer (issue 5): learning runs, resume after kill -9,
//! checkpoints, loggers, reward functions and the engine's gradient accumulation.

#[path = "../common/mod.rs"]
mod common;

mod agent;
mod agent_loops;
mod asynchronous;
mod checkpoint;
mod distributed;
mod engine;
mod examples;
mod learning;
mod logging;
mod preflight;
mod python_data;
mod replay;
mod resume;
mod reward;
mod reward_managers;
mod sft;
mod support;
mod vllm;
