//! The inner update rules (torch `AdamW(fused=True)` and `SGD(fused=True)` semantics; AdamW
//! also op by op, as torch's default AdamW steps bf16 params) over lists of main params, with
//! their state.
use tch::{Device, Kind, Tensor};

use super::Result;
use crate::ops::{self, AdamWArgs, SgdArgs};

pub use verlc_spec::optim::{AdamWConfig, InnerConfig, SgdConfig};

/// Optimizer state of one main tensor.
#[derive(Debug)]
pub(crate) enum SlotState {
    Adam {
        exp_avg: Tensor,
        exp_avg_sq: Tensor,
        step: Tensor,
    },
    /// `momentum_buffer` (None until the first step, like torch).
    Sgd {
        momentum_buffer: Option<Tensor>,
        steps: u64,
    },
}

impl SlotState {
    pub(crate) fn new(cfg: &InnerConfig, like: &Tensor) -> Result<Self> {
        Ok(match cfg {
            InnerConfig::AdamW(_) => SlotState::Adam {
                exp_avg: like.f_zeros_like()?,
                exp_avg_sq: like.f_zeros_like()?,
                step: Tensor::f_zeros([], (Kind::Float, like.device()))?,
            },
            InnerConfig::Sgd(_) => SlotState::Sgd {
                momentum_buffer: None,
                steps: 0,
            },
        })
    }

    /// Completed steps of this slot.
    /// Adam's state with its moments in the given (zeroed) buffers.
    pub(crate) fn adam(exp_avg: Tensor, exp_avg_sq: Tensor) -> Result<Self> {
        let step = Tensor::f_zeros([], (Kind::Float, exp_avg.device()))?;
        Ok(SlotState::Adam {
            exp_avg,
            exp_avg_sq,
            step,
        })
    }

    pub(crate) fn step_count(&self) -> Result<u64> {
        Ok(match self {
            SlotState::Adam { step, .. } => step.f_double_value(&[])? as u64,
            SlotState::Sgd { steps, .. } => *steps,
        })
    }

    pub(crate) fn set_step_count(&mut self, n: u64) -> Result<()> {
        match self {
            SlotState::Adam { step, .. } => {
                let _ = step.f_fill_(n as f64)?;
            }
            SlotState::Sgd { steps, .. } => *steps = n,
        }
        Ok(())
    }
}

/// How an AdamW step rounds: torch's fused kernel (once per element; the step verlc takes on
/// fp32 main params), or op by op as torch's default AdamW does (each op rounds to the params'
/// dtype: what a torch optimizer over bf16 params computes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdamRounding {
    Fused,
    PerOp,
}

/// One update of `params` (one device, one dtype) with `grads`, lr and weight decay of the
/// group.
pub(crate) fn step_slots(
    cfg: &InnerConfig,
    params: &[Tensor],
    grads: &[Tensor],
    states: &mut [&mut SlotState],
    (lr, weight_decay): (f64, f64),
    rounding: AdamRounding,
) -> Result<()> {
    if params.is_empty() {
        return Ok(());
    }
    match cfg {
        InnerConfig::AdamW(a) => {
            let mut m = Vec::with_capacity(params.len());
            let mut v = Vec::with_capacity(params.len());
            let mut s = Vec::with_capacity(params.len());
            for st in states.iter() {
                if let SlotState::Adam {
                    exp_avg,
                    exp_avg_sq,
                    step,
                } = &**st
                {
                    m.push(exp_avg.shallow_clone());
                    v.push(exp_avg_sq.shallow_clone());
                    s.push(step.shallow_clone());
                }
            }
            // torch increments the step tensors before the kernel reads them.
            for st in &mut s {
                let _ = st.f_add_scalar_(1.0)?;
            }
            let args = AdamWArgs {
                lr,
                beta1: a.beta1,
                beta2: a.beta2,
                weight_decay,
                eps: a.eps,
                maximize: false,
            };
            match rounding {
                AdamRounding::Fused => {
                    ops::fused_adamw(params, grads, &m, &v, &s, args, None, None)?
                }
                AdamRounding::PerOp => {
                    let steps: Vec<f64> = s
                        .iter()
                        .map(|t| t.f_double_value(&[]))
                        .collect::<std::result::Result<_, _>>()?;
                    ops::foreach_adamw(params, grads, &m, &v, &steps, args)?;
                }
            }
        }
        InnerConfig::Sgd(c) => {
            let args = SgdArgs {
                lr,
                momentum: c.momentum,
                dampening: c.dampening,
                weight_decay,
                nesterov: c.nesterov,
                maximize: false,
            };
            // The kernel's first-step flag is per call: step fresh and warm slots separately
            // (decided before the first call creates buffers).
            let fresh: Vec<bool> = states
                .iter()
                .map(|st| {
                    matches!(
                        &**st,
                        SlotState::Sgd {
                            momentum_buffer: None,
                            ..
                        }
                    )
                })
                .collect();
            for first in [true, false] {
                let mut p = Vec::new();
                let mut g = Vec::new();
                let mut b = Vec::new();
                for (i, st) in states.iter_mut().enumerate() {
                    if let SlotState::Sgd {
                        momentum_buffer,
                        steps,
                    } = &mut **st
                    {
                        if fresh[i] != first {
                            continue;
                        }
                        if c.momentum != 0.0 {
                            let buf = match momentum_buffer {
                                Some(buf) => buf.shallow_clone(),
                                None => {
                                    let buf = params[i].f_empty_like()?;
                                    *momentum_buffer = Some(buf.shallow_clone());
                                    buf
                                }
                            };
                            b.push(buf);
                        }
                        *steps += 1;
                        p.push(params[i].shallow_clone());
                        g.push(grads[i].shallow_clone());
                    }
                }
                // Without momentum no buffer is ever created: every call is a "first" step.
                ops::fused_sgd(&p, &g, &b, args, first)?;
            }
        }
    }
    Ok(())
}

/// A fresh fp32 scalar on `device` (used for found-inf flags).
pub(crate) fn scalar_f32(v: f32, device: Device) -> Result<Tensor> {
    Ok(Tensor::from_slice(&[v]).f_to_device(device)?)
}
