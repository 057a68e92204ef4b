//! Gradient statistics and clipping (`megatron/core/optimizer/clip_grads.py`), fp32 and
//! device-generic: grads may sit on several devices (host offload), partial results are
//! combined on the reduction group's device.
use tch::{Device, Kind, Tensor};

use super::Result;
use crate::ops;
use crate::parallel::dist::{ProcessGroup, ReduceOp};

/// Which norm [`grad_norm_fp32`] computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormType {
    L2,
    Inf,
    /// Any other p-norm (sum of `|g|^p`, then `^(1/p)`).
    P(f64),
}

/// Epsilon Megatron adds to the norm in the clip coefficient.
pub const CLIP_EPS: f64 = 1.0e-6;

/// `grads` grouped by device, in the order the devices first appear.
pub(crate) fn by_device(grads: &[Tensor]) -> Vec<(Device, Vec<Tensor>)> {
    let mut out: Vec<(Device, Vec<Tensor>)> = Vec::new();
    for g in grads {
        let d = g.device();
        match out.iter_mut().find(|(k, _)| *k == d) {
            Some((_, v)) => v.push(g.shallow_clone()),
            None => out.push((d, vec![g.shallow_clone()])),
        }
    }
    out
}

/// Where partial results over `group`'s ranks are combined (CPU without a group).
pub(crate) fn reduce_device(group: Option<&ProcessGroup>) -> Device {
    group.map_or(Device::Cpu, ProcessGroup::device)
}

/// Global norm of `grads`, reduced over `group` (Megatron's `get_grad_norm_fp32`): L2 sums
/// the squared local norms (norm of per-tensor norms, squared) across ranks; inf takes the
/// max. Returns a host f64 (the fp32 sum, rooted in double, like Megatron's float path).
pub fn grad_norm_fp32(
    grads: &[Tensor],
    norm: NormType,
    group: Option<&ProcessGroup>,
) -> Result<f64> {
    let dev = reduce_device(group);
    let mut acc = Tensor::zeros([1], (Kind::Float, dev));
    for (_, gs) in by_device(grads) {
        let part = match norm {
            NormType::L2 => {
                let norms = ops::foreach_norm(&gs, 2.0)?;
                Tensor::f_stack(&norms, 0)?.f_norm()?.f_square()?
            }
            NormType::Inf => {
                let norms = ops::foreach_norm(&gs, f64::INFINITY)?;
                Tensor::f_stack(&norms, 0)?.f_max()?
            }
            NormType::P(p) => {
                let norms = ops::foreach_norm(&gs, p)?;
                Tensor::f_stack(&norms, 0)?
                    .f_pow_tensor_scalar(p)?
                    .f_sum(Kind::Float)?
            }
        };
        let part = part.f_to_device(dev)?.f_reshape([1])?;
        acc = match norm {
            NormType::Inf => acc.f_maximum(&part)?,
            _ => acc.f_add(&part)?,
        };
    }
    if let Some(g) = group {
        let op = if norm == NormType::Inf {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        g.all_reduce(&acc, op)?;
    }
    let total = acc.f_double_value(&[0])?;
    Ok(match norm {
        NormType::L2 => total.sqrt(),
        NormType::Inf => total,
        NormType::P(p) => total.powf(1.0 / p),
    })
}

/// Scales `grads` by `max_norm / (total_norm + 1e-6)` when that is below 1
/// (`clip_grad_by_total_norm_fp32`); returns the coefficient used (1.0 if none).
pub fn clip_grad_by_total_norm_fp32(
    grads: &[Tensor],
    max_norm: f64,
    total_norm: f64,
) -> Result<f64> {
    let coeff = max_norm / (total_norm + CLIP_EPS);
    if coeff < 1.0 {
        for (_, gs) in by_device(grads) {
            ops::foreach_mul_scalar(&gs, coeff)?;
        }
        return Ok(coeff);
    }
    Ok(1.0)
}

/// Computes the total norm, clips, and returns the norm (like `clip_grad_norm_`).
pub fn clip_grad_norm_fp32(
    grads: &[Tensor],
    max_norm: f64,
    norm: NormType,
    group: Option<&ProcessGroup>,
) -> Result<f64> {
    let total = grad_norm_fp32(grads, norm, group)?;
    clip_grad_by_total_norm_fp32(grads, max_norm, total)?;
    Ok(total)
}

/// Number of zero elements over `grads`, summed over `group` (`count_zeros_fp32`).
pub fn count_zeros_fp32(grads: &[Tensor], group: Option<&ProcessGroup>) -> Result<u64> {
    let dev = reduce_device(group);
    let mut total = Tensor::zeros([1], (Kind::Int64, dev));
    for g in grads {
        let nonzero = g.f_count_nonzero(None::<i64>)?.f_to_device(dev)?;
        let zeros = Tensor::from_slice(&[g.numel() as i64])
            .f_to_device(dev)?
            .f_sub(&nonzero)?;
        total = total.f_add(&zeros)?;
    }
    if let Some(g) = group {
        g.all_reduce(&total, ReduceOp::Sum)?;
    }
    Ok(total.f_int64_value(&[0])?.max(0) as u64)
}
