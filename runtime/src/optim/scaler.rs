//! Loss / grad scalers (`megatron/core/optimizer/grad_scaler.py`).
//!
//! The scale is an fp32 value, as Megatron's 1-element fp32 tensor; `inv_scale` is
//! `float32(1 / float64(scale))`.
//!
//! The optimizer reaches a scaler only through [`LossScaler`], built by the constructor a
//! [`LossScaling`] carries. A trainer binary gets its `LossScaling` from its precision marker
//! (`verlc_runtime::binding::Precision`): only the fp16 binding carries one, so fp32 and bf16
//! binaries link no loss-scaling code at all (`cli/tests/build_matrix.rs` checks the
//! symbols).
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::{OptimError, Result};
use crate::ops;
use crate::parallel::dist::{ProcessGroup, ReduceOp};

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

/// A loss scaler as the optimizer drives it (Megatron's `MegatronGradScaler`).
pub trait LossScaler: Send + std::fmt::Debug {
    /// Current loss scale.
    fn scale(&self) -> f32;
    /// A copy of the scaler's state.
    fn state(&self) -> GradScaler;
    /// The state as checkpoint metadata.
    fn save(&self) -> Result<serde_json::Value>;
    /// Restores a [`save`](Self::save)d state.
    fn restore(&mut self, saved: serde_json::Value) -> Result<()>;
    /// Multiplies the fp32 main grads by `1/scale` in place, finds inf/nan among them (MAX over
    /// `mp_group`), updates the scale and returns whether an overflow was found.
    fn unscale_and_check(
        &mut self,
        grads: &[Tensor],
        mp_group: Option<&ProcessGroup>,
    ) -> Result<bool>;
}

impl GradScaler {
    fn boxed(config: ScalerConfig) -> Result<Box<dyn LossScaler>> {
        Ok(Box::new(GradScaler::new(config)?))
    }
}

impl LossScaler for GradScaler {
    fn scale(&self) -> f32 {
        self.scale
    }

    fn state(&self) -> GradScaler {
        self.clone()
    }

    fn save(&self) -> Result<serde_json::Value> {
        serde_json::to_value(self).map_err(|e| OptimError::Config(format!("grad scaler: {e}")))
    }

    fn restore(&mut self, saved: serde_json::Value) -> Result<()> {
        *self = serde_json::from_value(saved)
            .map_err(|e| OptimError::Config(format!("saved grad scaler: {e}")))?;
        Ok(())
    }

    fn unscale_and_check(
        &mut self,
        grads: &[Tensor],
        mp_group: Option<&ProcessGroup>,
    ) -> Result<bool> {
        let inv = self.inv_scale();
        let reduce_dev = super::clip::reduce_device(mp_group);
        let mut found = Tensor::f_zeros([1], (Kind::Float, reduce_dev))?;
        for (dev, gs) in super::clip::by_device(grads) {
            let found_d = Tensor::f_zeros([1], (Kind::Float, dev))?;
            let inv_d = super::inner::scalar_f32(inv, dev)?;
            ops::non_finite_check_and_unscale(&gs, &found_d, &inv_d)?;
            found = found.f_maximum(&found_d.f_to_device(reduce_dev)?)?;
        }
        if let Some(g) = mp_group {
            g.all_reduce(&found, ReduceOp::Max)?;
        }
        let overflow = found.f_double_value(&[0])? > 0.0;
        self.update(overflow);
        Ok(overflow)
    }
}

/// Builds a boxed loss scaler.
pub type ScalerCtor = fn(ScalerConfig) -> Result<Box<dyn LossScaler>>;

/// The constructor of the loss scaler a program links, if any (see the module docs).
#[derive(Clone, Copy)]
pub struct LossScaling(Option<ScalerCtor>);

impl LossScaling {
    /// No loss-scaling code: an optimizer that needs a scaler is refused.
    pub const NONE: LossScaling = LossScaling(None);
    /// Megatron's constant and dynamic scalers ([`GradScaler`]).
    pub const LINKED: LossScaling = LossScaling(Some(GradScaler::boxed));

    pub fn is_linked(self) -> bool {
        self.0.is_some()
    }

    pub(crate) fn build(self, config: ScalerConfig) -> Result<Box<dyn LossScaler>> {
        match self.0 {
            Some(make) => make(config),
            None => Err(OptimError::Config(
                "a grad scaler is needed (fp16), but this program was built without loss \
                 scaling; rebuild it with verlc for the fp16 precision"
                    .into(),
            )),
        }
    }
}

impl std::fmt::Debug for LossScaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_linked() {
            "LossScaling::LINKED"
        } else {
            "LossScaling::NONE"
        })
    }
}

impl PartialEq for LossScaling {
    fn eq(&self, other: &Self) -> bool {
        self.is_linked() == other.is_linked()
    }
}
