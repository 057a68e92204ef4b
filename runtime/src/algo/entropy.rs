//! Token entropy from logits and the entropy term of the actor loss
//! (`L −= entropy_coeff · agg(H)`).
use tch::{Kind, Tensor};

use super::agg::{AggOptions, LossAggMode, agg_loss};
use super::{AlgoError, Result, check};

/// Shannon entropy of softmax(logits) over the last dimension:
/// `logsumexp(z) − Σ_v softmax(z)_v · z_v` (verl's `entropy_from_logits`). `[.., vocab]` →
/// `[..]`, differentiable.
pub fn entropy_from_logits(logits: &Tensor) -> Result<Tensor> {
    check::floating(logits, "logits")?;
    if logits.dim() == 0 {
        return Err(AlgoError::Shape {
            name: "logits",
            expected: "[.., vocab]".into(),
            got: logits.size(),
        });
    }
    let p = logits.f_softmax(-1, None::<Kind>)?;
    let expected_logit = p
        .f_mul(logits)?
        .f_sum_dim_intlist(-1i64, false, None::<Kind>)?;
    Ok(logits.f_logsumexp(-1i64, false)?.f_sub(&expected_logit)?)
}

/// `agg(entropy_from_logits(logits))` over `response_mask` (`[batch, response_len, vocab]`
/// logits); verl's `compute_entropy_loss`.
pub fn entropy_loss(
    logits: &Tensor,
    response_mask: &Tensor,
    mode: LossAggMode,
    opts: &AggOptions,
) -> Result<Tensor> {
    let entropy = entropy_from_logits(logits)?;
    agg_loss(&entropy, response_mask, mode, opts)
}
