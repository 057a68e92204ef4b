//! Learning-rate / weight-decay schedulers. Both write `lr` (and Megatron's also
//! `weight_decay`) into the optimizer's [`GroupOptions`] and are stepped *after* a successful
//! optimizer step, as verl and Megatron do.
mod megatron;
mod verl;

pub use megatron::{
    LrDecayStyle, MegatronSchedulerConfig, OptimizerParamScheduler, WdIncrStyle, WsdDecayStyle,
};
pub use verl::{VerlLrScheduler, VerlSchedule, VerlSchedulerConfig};

use serde::{Deserialize, Serialize};

use super::GroupOptions;

/// Either scheduler, as stored in checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LrScheduler {
    Verl(VerlLrScheduler),
    Megatron(OptimizerParamScheduler),
}

impl LrScheduler {
    /// Advances the schedule and writes the new values into `groups`. Megatron counts
    /// samples (pass `num_microbatches * micro_batch_size * dp`); verl counts optimizer steps
    /// and ignores `increment`.
    pub fn step(&mut self, increment: u64, groups: &mut [GroupOptions]) {
        match self {
            LrScheduler::Verl(s) => s.step(groups),
            LrScheduler::Megatron(s) => s.step(increment as f64, groups),
        }
    }

    /// Writes the current values into `groups` without advancing (after a checkpoint load).
    pub fn apply(&self, groups: &mut [GroupOptions]) {
        match self {
            LrScheduler::Verl(s) => s.apply(groups),
            LrScheduler::Megatron(s) => s.apply(groups),
        }
    }
}
