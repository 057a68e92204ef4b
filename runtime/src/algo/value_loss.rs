//! The critic's clipped value loss (verl's `compute_value_loss`):
//! `v̂_clip = clip(v̂, V_old − c, V_old + c)`;
//! `L = ½ · agg(max((v̂ − R)², (v̂_clip − R)²))`;
//! `critic/vf_clipfrac = mean_m[(v̂_clip − R)² > (v̂ − R)²]`.
use tch::Tensor;

use super::agg::{AggOptions, LossAggMode, agg_loss};
use super::masked::masked_mean;
use super::{AlgoError, Result, check};

/// Result of [`compute_value_loss`].
#[derive(Debug)]
pub struct ValueLoss {
    /// The scalar loss to back-propagate (`critic/vf_loss`).
    pub loss: Tensor,
    /// `critic/vf_clipfrac` (0-d, detached).
    pub vf_clipfrac: Tensor,
}

/// `vpreds`: the critic's current values; `returns`: targets; `values`: the values at rollout
/// time (`V_old`); all `[batch, response_len]`. `cliprange_value` is `critic.cliprange_value`.
pub fn compute_value_loss(
    vpreds: &Tensor,
    returns: &Tensor,
    values: &Tensor,
    response_mask: &Tensor,
    cliprange_value: f64,
    mode: LossAggMode,
    opts: &AggOptions,
) -> Result<ValueLoss> {
    check::same_2d(&[
        (vpreds, "vpreds"),
        (returns, "returns"),
        (values, "values"),
        (response_mask, "response_mask"),
    ])?;
    check::floating(vpreds, "vpreds")?;
    if cliprange_value.is_nan() || cliprange_value < 0.0 {
        return Err(AlgoError::Config(format!(
            "cliprange_value must be non-negative, got {cliprange_value}"
        )));
    }
    let low = values.f_sub_scalar(cliprange_value)?;
    let high = values.f_add_scalar(cliprange_value)?;
    // max(min(x, high), low), like verl's clip_by_value.
    let clipped = vpreds.f_minimum(&high)?.f_maximum(&low)?;
    let loss1 = vpreds.f_sub(returns)?.f_square()?;
    let loss2 = clipped.f_sub(returns)?.f_square()?;
    let loss_mat = loss1.f_maximum(&loss2)?;
    let loss = agg_loss(&loss_mat, response_mask, mode, opts)?.f_mul_scalar(0.5)?;
    let clipfrac = masked_mean(
        &loss2.f_gt_tensor(&loss1)?.f_to_kind(loss1.f_kind()?)?,
        response_mask,
    )?
    .f_detach()?;
    Ok(ValueLoss {
        loss,
        vf_clipfrac: clipfrac,
    })
}
