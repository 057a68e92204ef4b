//! KL estimators (docs/algorithms.md), used for the in-reward KL penalty (`algorithm.kl_penalty`) and
//! the actor's KL loss (`actor.kl_loss_type`). With `Δ = log π − log π_ref` per token:
//!
//! | kind | verl names | value |
//! |---|---|---|
//! | [`KlKind::K1`] | `kl`, `k1` | `Δ` |
//! | [`KlKind::Abs`] | `abs` | `\|Δ\|` |
//! | [`KlKind::K2`] | `mse`, `k2` | `½Δ²` |
//! | [`KlKind::K3`] | `low_var_kl`, `k3` | `δ = clamp(−Δ, −20, 20)`; `clamp(e^δ − δ − 1, −10, 10)` |
//! | [`KlKind::Full`] | `full` | `Σ_v π(v)(log π(v) − log π_ref(v))` over `[batch, len, vocab]` log-probs |
//!
//! A name ending in `+` is straight-through: the value of the named estimator with the gradient
//! of `k2` (`b − sg(b) + sg(f)` with `f` the forward and `b` the backward estimator). k1 and k3
//! are unbiased for the KL value but their expected gradient is not the KL gradient; k2's is.
//! [`KlEstimator`] allows any forward/backward pair; the `+` names use k2 as backward.
//!
//! verl itself raises NotImplementedError for `full` (it only gets token log-probs) and, at the
//! commit verlc's 0.7 model was read from, also for the `+` names (the suffix is not stripped
//! before the forward estimator is chosen); verlc implements both as documented.
use tch::{Kind, Tensor};

use super::agg::{AggOptions, LossAggMode, agg_loss};
use super::{AlgoError, Result, check};

pub use verlc_spec::algo::{KL_NAMES, KlEstimator, KlKind};

/// The value of one estimator. For [`KlKind::Full`], `log_prob` and `ref_log_prob` are
/// full-vocabulary log-probs `[batch, response_len, vocab]` and the result is
/// `[batch, response_len]`; for the others they are token log-probs of any (equal) shape.
pub fn kl_value(kind: KlKind, log_prob: &Tensor, ref_log_prob: &Tensor) -> Result<Tensor> {
    check::shape(ref_log_prob, "ref_log_prob", &log_prob.size())?;
    check::device(ref_log_prob, "ref_log_prob", "log_prob", log_prob.device())?;
    check::floating(log_prob, "log_prob")?;
    let delta = || log_prob.f_sub(ref_log_prob);
    Ok(match kind {
        KlKind::K1 => delta()?,
        KlKind::Abs => delta()?.f_abs()?,
        KlKind::K2 => delta()?.f_square()?.f_mul_scalar(0.5)?,
        KlKind::K3 => {
            let d = ref_log_prob.f_sub(log_prob)?.f_clamp(-20.0, 20.0)?;
            d.f_exp()?
                .f_sub(&d)?
                .f_sub_scalar(1.0)?
                .f_clamp(-10.0, 10.0)?
        }
        KlKind::Full => {
            if log_prob.dim() != 3 {
                return Err(AlgoError::Shape {
                    name: "log_prob",
                    expected: "[batch, response_len, vocab] log-probs for the full KL".into(),
                    got: log_prob.size(),
                });
            }
            log_prob
                .f_exp()?
                .f_mul(&delta()?)?
                .f_sum_dim_intlist(-1i64, false, None::<Kind>)?
        }
    })
}

/// The KL estimate `est` per element: the value of `est.value`, carrying the gradient of
/// `est.grad` when the two differ (`b − sg(b) + sg(f)`).
pub fn kl_penalty(log_prob: &Tensor, ref_log_prob: &Tensor, est: KlEstimator) -> Result<Tensor> {
    let forward = kl_value(est.value, log_prob, ref_log_prob)?;
    if !est.is_straight_through() {
        return Ok(forward);
    }
    if est.value == KlKind::Full || est.grad == KlKind::Full {
        return Err(AlgoError::Unsupported(format!(
            "straight-through KL `{est}`: the full-vocabulary KL cannot be combined with a token estimator"
        )));
    }
    let backward = kl_value(est.grad, log_prob, ref_log_prob)?;
    Ok(backward
        .f_sub(&backward.f_detach()?)?
        .f_add(&forward.f_detach()?)?)
}

/// The actor's KL loss: `agg(kl_penalty(log π, log π_ref))` over `response_mask` (the caller
/// multiplies by `kl_loss_coef`).
pub fn kl_loss(
    log_prob: &Tensor,
    ref_log_prob: &Tensor,
    response_mask: &Tensor,
    est: KlEstimator,
    mode: LossAggMode,
    opts: &AggOptions,
) -> Result<Tensor> {
    let kl = kl_penalty(log_prob, ref_log_prob, est)?;
    agg_loss(&kl, response_mask, mode, opts)
}
