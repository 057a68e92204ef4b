//! Megatron's `OptimizerParamScheduler` (`megatron/core/optimizer_param_scheduler.py`): lr
//! warmup then linear / cosine / inverse-square-root / WSD decay, weight-decay increment,
//! per-group `max_lr` / `min_lr` / `wd_mult` / `start_wd` / `end_wd`. Steps count samples.
use serde::{Deserialize, Serialize};

use crate::optim::{GroupOptions, OptimError, Result};

pub use verlc_spec::optim::{LrDecayStyle, MegatronSchedulerConfig, WdIncrStyle, WsdDecayStyle};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerParamScheduler {
    config: MegatronSchedulerConfig,
    num_steps: f64,
}

impl OptimizerParamScheduler {
    /// Checks Megatron's constructor assertions and applies `step(0)`.
    // Negated comparisons also reject NaN.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn new(config: MegatronSchedulerConfig, groups: &mut [GroupOptions]) -> Result<Self> {
        let c = &config;
        let bad = |m: String| Err(OptimError::Config(format!("OptimizerParamScheduler: {m}")));
        if !(c.min_lr >= 0.0) {
            return bad(format!("min_lr {} must be >= 0", c.min_lr));
        }
        if !(c.max_lr >= c.min_lr) {
            return bad(format!(
                "max_lr {} must be >= min_lr {}",
                c.max_lr, c.min_lr
            ));
        }
        if !(c.init_lr <= c.max_lr) {
            return bad(format!(
                "lr_warmup_init {} must be <= max_lr {}",
                c.init_lr, c.max_lr
            ));
        }
        if !(c.lr_decay_steps > 0.0) {
            return bad("lr_decay_steps must be positive".into());
        }
        if !(c.lr_warmup_steps < c.lr_decay_steps) {
            return bad(format!(
                "lr_warmup_steps {} must be below lr_decay_steps {}",
                c.lr_warmup_steps, c.lr_decay_steps
            ));
        }
        if c.lr_decay_style == LrDecayStyle::Wsd
            && (c.wsd_decay_steps.is_none() || c.lr_wsd_decay_style.is_none())
        {
            return bad("WSD needs wsd_decay_steps and lr_wsd_decay_style".into());
        }
        if !(0.0 <= c.start_wd && c.start_wd <= c.end_wd) {
            return bad(format!(
                "need 0 <= start_wd ({}) <= end_wd ({})",
                c.start_wd, c.end_wd
            ));
        }
        if c.wd_incr_style != WdIncrStyle::Constant && !(c.wd_incr_steps > 0.0) {
            return bad("wd_incr_steps must be positive".into());
        }
        let mut s = OptimizerParamScheduler {
            config,
            num_steps: 0.0,
        };
        s.step(0.0, groups);
        Ok(s)
    }

    pub fn config(&self) -> &MegatronSchedulerConfig {
        &self.config
    }

    pub fn num_steps(&self) -> f64 {
        self.num_steps
    }

    /// Weight decay at the current step for a group (before `wd_mult`).
    pub fn get_wd(&self, group: &GroupOptions) -> f64 {
        let c = &self.config;
        let start = group.start_wd.unwrap_or(c.start_wd);
        let end = group.end_wd.unwrap_or(c.end_wd);
        if self.num_steps > c.wd_incr_steps {
            return end;
        }
        let ratio = self.num_steps / c.wd_incr_steps;
        let coeff = match c.wd_incr_style {
            WdIncrStyle::Constant => return end,
            WdIncrStyle::Linear => ratio,
            WdIncrStyle::Cosine => 0.5 * ((std::f64::consts::PI * (1.0 - ratio)).cos() + 1.0),
        };
        start + coeff * (end - start)
    }

    /// Learning rate at the current step for a group.
    pub fn get_lr(&self, group: &GroupOptions) -> f64 {
        let c = &self.config;
        let max_lr = group.max_lr.unwrap_or(c.max_lr);
        let min_lr = group.min_lr.unwrap_or(c.min_lr);
        let (t, w, d) = (self.num_steps, c.lr_warmup_steps, c.lr_decay_steps);
        if w > 0.0 && t <= w {
            return c.init_lr + (max_lr - c.init_lr) * t / w;
        }
        if c.lr_decay_style == LrDecayStyle::Constant {
            return max_lr;
        }
        if t > d {
            return min_lr;
        }
        if c.lr_decay_style == LrDecayStyle::InverseSquareRoot {
            let warmup = w.max(1.0);
            let steps = t.max(1.0);
            let lr = max_lr * warmup.sqrt() / steps.sqrt();
            return min_lr.max(lr);
        }
        let decay_ratio = (t - w) / (d - w);
        let delta = max_lr - min_lr;
        let pi = std::f64::consts::PI;
        let coeff = match c.lr_decay_style {
            LrDecayStyle::Linear => 1.0 - decay_ratio,
            LrDecayStyle::Cosine => 0.5 * ((pi * decay_ratio).cos() + 1.0),
            LrDecayStyle::Wsd => {
                // Validated in `new`.
                let wsd_steps = c.wsd_decay_steps.unwrap_or(0.0);
                let anneal_start = d - wsd_steps;
                if t <= anneal_start {
                    1.0
                } else {
                    let r = (t - anneal_start) / wsd_steps;
                    match c.lr_wsd_decay_style.unwrap_or(WsdDecayStyle::Exponential) {
                        WsdDecayStyle::Linear => 1.0 - r,
                        WsdDecayStyle::Cosine => 0.5 * ((pi * r).cos() + 1.0),
                        WsdDecayStyle::Exponential => 2.0 * 0.5f64.powf(r) - 1.0,
                        WsdDecayStyle::MinusSqrt => 1.0 - r.sqrt(),
                    }
                }
            }
            LrDecayStyle::Constant | LrDecayStyle::InverseSquareRoot => 1.0,
        };
        min_lr + coeff * delta
    }

    /// `num_steps += increment`, then every group gets `lr = get_lr(group)` and
    /// `weight_decay = get_wd(group) * wd_mult`.
    pub fn step(&mut self, increment: f64, groups: &mut [GroupOptions]) {
        self.num_steps += increment;
        self.apply(groups);
    }

    pub fn apply(&self, groups: &mut [GroupOptions]) {
        for g in groups {
            g.lr = self.get_lr(g);
            g.weight_decay = self.get_wd(g) * g.wd_mult;
        }
    }
}
