//! verl's FSDP schedulers (`verl/utils/torch_functional.py`): constant and cosine with linear
//! warmup, as torch `LambdaLR`s (`lr = initial_lr * lambda(step)`).
use serde::{Deserialize, Serialize};

use crate::optim::{GroupOptions, OptimError, Result};

pub use verlc_spec::optim::{VerlSchedule, VerlSchedulerConfig};

fn zero_indexed_default() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerlLrScheduler {
    schedule: VerlSchedule,
    /// verl 0.9's `zero_indexed_step` (cosine only): `false` shifts the schedule by one step.
    #[serde(default = "zero_indexed_default")]
    zero_indexed_step: bool,
    warmup_steps: i64,
    total_steps: i64,
    /// Each group's lr when the scheduler was created (`initial_lr`).
    base_lrs: Vec<f64>,
    /// Completed scheduler steps (`last_epoch`).
    step: i64,
}

impl VerlLrScheduler {
    /// Captures the groups' current lr as base and applies `lambda(0)` (LambdaLR's init).
    pub fn new(config: &VerlSchedulerConfig, groups: &mut [GroupOptions]) -> Result<Self> {
        if let VerlSchedule::Cosine { min_lr_ratio, .. } | VerlSchedule::Wsd { min_lr_ratio, .. } =
            config.schedule
            && !(0.0..=1.0).contains(&min_lr_ratio)
        {
            return Err(OptimError::Config(format!(
                "min_lr_ratio {min_lr_ratio} must be in [0, 1]"
            )));
        }
        let s = VerlLrScheduler {
            schedule: config.schedule,
            zero_indexed_step: config.zero_indexed_step,
            warmup_steps: config.warmup_steps(),
            total_steps: config.total_training_steps,
            base_lrs: groups.iter().map(|g| g.lr).collect(),
            step: 0,
        };
        s.apply(groups);
        Ok(s)
    }

    pub fn warmup_steps(&self) -> i64 {
        self.warmup_steps
    }

    pub fn current_step(&self) -> i64 {
        self.step
    }

    /// The multiplier at `step`.
    pub fn lambda(&self, step: i64) -> f64 {
        let w = self.warmup_steps;
        match self.schedule {
            VerlSchedule::Constant => {
                if step < w {
                    step as f64 / f64::max(1.0, w as f64)
                } else {
                    1.0
                }
            }
            VerlSchedule::Cosine {
                min_lr_ratio,
                num_cycles,
            } => {
                let step = if self.zero_indexed_step {
                    step
                } else {
                    step + 1
                };
                let coef = (1.0 - min_lr_ratio) * 0.5;
                let intercept = (1.0 + min_lr_ratio) * 0.5;
                if step < w {
                    // init_lr_ratio = 0: 0 + (1 - 0) * (step / max(1, W))
                    return 0.0 + (1.0 - 0.0) * (step as f64 / i64::max(1, w) as f64);
                }
                let progress = (step - w) as f64 / i64::max(1, self.total_steps - w) as f64;
                let x = (std::f64::consts::PI * num_cycles * 2.0 * progress).cos();
                f64::max(min_lr_ratio, x * coef + intercept)
            }
            VerlSchedule::Wsd {
                min_lr_ratio,
                num_cycles,
                stable_ratio,
            } => {
                let remaining = i64::max(0, self.total_steps - w);
                let stable = (remaining as f64 * stable_ratio) as i64;
                let decay = remaining - stable;
                if step < w {
                    step as f64 / i64::max(1, w) as f64
                } else if step < w + stable {
                    1.0
                } else if step < self.total_steps {
                    let progress = (step - w - stable) as f64 / i64::max(1, decay) as f64;
                    let value = f64::max(
                        0.0,
                        0.5 * (1.0 + (std::f64::consts::PI * num_cycles * 2.0 * progress).cos()),
                    );
                    (1.0 - min_lr_ratio) * value + min_lr_ratio
                } else {
                    min_lr_ratio
                }
            }
        }
    }

    pub fn step(&mut self, groups: &mut [GroupOptions]) {
        self.step += 1;
        self.apply(groups);
    }

    pub fn apply(&self, groups: &mut [GroupOptions]) {
        let l = self.lambda(self.step);
        for (g, base) in groups.iter_mut().zip(&self.base_lrs) {
            g.lr = base * l;
        }
    }
}
