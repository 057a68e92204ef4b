//! Loss / grad scalers (`megatron/core/optimizer/grad_scaler.py`).
//!
//! The scale is an fp32 value, as Megatron's 1-element fp32 tensor; `inv_scale` is
//! `float32(1 / float64(scale))`.
use serde::{Deserialize, Serialize};

use super::{OptimError, Result};

/// How to build a scaler (Megatron: `loss_scale` set → constant; fp16 without it → dynamic).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ScalerConfig {
    Constant {
        scale: f64,
    },
    Dynamic {
        initial_scale: f64,
        min_scale: f64,
        growth_factor: f64,
        backoff_factor: f64,
        growth_interval: u64,
        hysteresis: i64,
    },
}

impl ScalerConfig {
    /// Megatron's defaults for fp16: `initial_loss_scale=2**32, min_loss_scale=1,
    /// growth 2, backoff 0.5, loss_scale_window=1000, hysteresis=2`.
    pub fn megatron_dynamic() -> Self {
        ScalerConfig::Dynamic {
            initial_scale: 4294967296.0,
            min_scale: 1.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 1000,
            hysteresis: 2,
        }
    }
}

/// Constant or dynamic scaler. With either, the optimizer checks grads for inf/nan and skips
/// the step on overflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GradScaler {
    config: ScalerConfig,
    scale: f32,
    growth_tracker: u64,
    hysteresis_tracker: i64,
}

impl GradScaler {
    // Negated comparisons also reject NaN.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn new(config: ScalerConfig) -> Result<Self> {
        let bad = |m: &str| Err(OptimError::Config(format!("grad scaler: {m}")));
        let (scale, hysteresis) = match config {
            ScalerConfig::Constant { scale } => {
                if !(scale > 0.0 && scale.is_finite()) {
                    return bad("scale must be positive and finite");
                }
                (scale, 0)
            }
            ScalerConfig::Dynamic {
                initial_scale,
                min_scale,
                growth_factor,
                backoff_factor,
                growth_interval,
                hysteresis,
            } => {
                if !(initial_scale > 0.0) {
                    return bad("initial_scale must be positive");
                }
                if !(min_scale > 0.0 && min_scale <= initial_scale) {
                    return bad("need 0 < min_scale <= initial_scale");
                }
                if !(growth_factor > 1.0) {
                    return bad("growth_factor must exceed 1");
                }
                if !(backoff_factor > 0.0 && backoff_factor < 1.0) {
                    return bad("backoff_factor must be in (0, 1)");
                }
                if growth_interval == 0 {
                    return bad("growth_interval must be positive");
                }
                if hysteresis <= 0 {
                    return bad("hysteresis must be positive");
                }
                (initial_scale, hysteresis)
            }
        };
        Ok(GradScaler {
            config,
            scale: scale as f32,
            growth_tracker: 0,
            hysteresis_tracker: hysteresis,
        })
    }

    pub fn config(&self) -> ScalerConfig {
        self.config
    }

    /// Current loss scale.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// `float32(1 / float64(scale))`.
    pub fn inv_scale(&self) -> f32 {
        (1.0f64 / self.scale as f64) as f32
    }

    pub fn growth_tracker(&self) -> u64 {
        self.growth_tracker
    }

    pub fn hysteresis_tracker(&self) -> i64 {
        self.hysteresis_tracker
    }

    /// Megatron's `update(found_inf)`. Note that a successful step does not reset the
    /// hysteresis tracker; only growth does.
    pub fn update(&mut self, found_inf: bool) {
        let ScalerConfig::Dynamic {
            min_scale,
            growth_factor,
            backoff_factor,
            growth_interval,
            hysteresis,
            ..
        } = self.config
        else {
            return;
        };
        if found_inf {
            self.growth_tracker = 0;
            self.hysteresis_tracker -= 1;
            if self.hysteresis_tracker <= 0 {
                self.scale = (self.scale * backoff_factor as f32).max(min_scale as f32);
            }
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == growth_interval {
                self.growth_tracker = 0;
                self.hysteresis_tracker = hysteresis;
                self.scale *= growth_factor as f32;
            }
        }
    }
}
