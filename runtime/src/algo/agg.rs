//! `loss_agg_mode` (docs/algorithms.md): how a `[batch, response_len]` loss matrix becomes the scalar
//! that is back-propagated.
//!
//! With `D = dp_size`, `N = batch_num_tokens` (global valid tokens; the local `Σm` if not
//! given) and `B = global_batch_size` (global number of non-empty sequences; local if not
//! given):
//!
//! | mode | loss |
//! |---|---|
//! | `token-mean` | `D · Σ_{i,t} m ℓ / N` |
//! | `seq-mean-token-sum` | `D · Σ_i [Σ_t m > 0] · Σ_t m ℓ / B` |
//! | `seq-mean-token-mean` | `D · Σ_i [Σ_t m > 0] · (Σ_t m ℓ / (Σ_t m + 1e-8)) / B` |
//! | `seq-mean-token-sum-norm` (verl 0.7.1 on) | `D · Σ_i [Σ_t m > 0] · Σ_t m ℓ / B / S` |
//! | `seq-mean-token-sum-norm` (verl 0.7.0) | `Σ_{i,t} m ℓ / S` |
//! | `token-sum` (verl 0.9) | `D · Σ_{i,t} m ℓ` |
//!
//! `S = loss_scale_factor`, else `response_len`. Which release's form runs is
//! [`AggOptions::release`]; from 0.7.1, with `D > 1` and valid tokens but no global counts
//! (`N` for `token-mean`, `B` for the `seq-mean-*` modes), verl raises, and so does this.
//!
//! The factor `D` cancels the gradient averaging of data-parallel engines, so that the global
//! gradient is the gradient of the global-batch loss. One deliberate difference from verl: a
//! locally derived `N` or `B` of zero (a micro-batch without valid tokens) is taken as 1, so the
//! loss is 0 instead of NaN.
use tch::{Kind, Tensor};

use super::masked::{MEAN_EPS, masked_sum, masked_sum_dim};
use super::{AlgoError, Result, check};

pub use verlc_spec::algo::{AlgoRelease, LossAggMode};

/// The global-batch information of verl's `global_batch_info`; all `None` with `dp_size = 1`
/// (the default) is verl's legacy, purely local normalisation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AggOptions {
    /// Data-parallel world size `D`.
    pub dp_size: usize,
    /// Valid tokens of the global batch (`token-mean`).
    pub batch_num_tokens: Option<f64>,
    /// Non-empty sequences of the global batch (`seq-mean-*`).
    pub global_batch_size: Option<f64>,
    /// Constant normaliser of `seq-mean-token-sum-norm`; the response length if `None`.
    pub loss_scale_factor: Option<f64>,
    /// Whose aggregation this is (the newest release's by default).
    pub release: AlgoRelease,
}

impl Default for AggOptions {
    fn default() -> Self {
        AggOptions {
            dp_size: 1,
            batch_num_tokens: None,
            global_batch_size: None,
            loss_scale_factor: None,
            release: AlgoRelease::NEWEST,
        }
    }
}

impl AggOptions {
    fn validate(&self) -> Result<()> {
        if self.dp_size == 0 {
            return Err(AlgoError::Config("dp_size must be at least 1".into()));
        }
        let positive = [
            ("batch_num_tokens", self.batch_num_tokens),
            ("global_batch_size", self.global_batch_size),
            ("loss_scale_factor", self.loss_scale_factor),
        ];
        for (name, v) in positive {
            if let Some(v) = v
                && !(v > 0.0 && v.is_finite())
            {
                return Err(AlgoError::Config(format!(
                    "{name} must be a positive number, got {v}"
                )));
            }
        }
        Ok(())
    }
}

/// `n`, or 1 where `n` is 0 (a local count of an empty micro-batch).
fn nonzero_count(n: &Tensor) -> Result<Tensor> {
    Ok(n.f_where_scalarother(&n.f_ne(0.0)?, 1.0)?)
}

/// Aggregates `loss_mat` (`[batch, response_len]`) over `loss_mask` according to `mode`.
pub fn agg_loss(
    loss_mat: &Tensor,
    loss_mask: &Tensor,
    mode: LossAggMode,
    opts: &AggOptions,
) -> Result<Tensor> {
    let (_, len) = check::same_2d(&[(loss_mat, "loss_mat"), (loss_mask, "loss_mask")])?;
    opts.validate()?;
    let kind = check::floating(loss_mat, "loss_mat")?;
    let dp = opts.dp_size as f64;
    if opts.dp_size > 1 && opts.release.seq_sum_norm_over_batch() {
        // verl 0.7.1 on: a data-parallel loss needs the global batch's counts.
        let missing = match mode {
            LossAggMode::TokenMean => opts
                .batch_num_tokens
                .is_none()
                .then_some("batch_num_tokens"),
            LossAggMode::SeqMeanTokenSum
            | LossAggMode::SeqMeanTokenMean
            | LossAggMode::SeqMeanTokenSumNorm => opts
                .global_batch_size
                .is_none()
                .then_some("global_batch_size"),
            LossAggMode::TokenSum => None,
        };
        let has_tokens = loss_mask.f_sum(Kind::Float)?.double_value(&[]) > 0.0;
        if let Some(what) = missing.filter(|_| has_tokens) {
            return Err(AlgoError::Config(format!(
                "{} over {} data-parallel ranks needs the global batch's {what}",
                mode.as_str(),
                opts.dp_size
            )));
        }
    }
    match mode {
        LossAggMode::TokenMean => {
            let total = masked_sum(loss_mat, loss_mask)?;
            let loss = match opts.batch_num_tokens {
                Some(n) => total.f_div_scalar(n)?,
                None => total.f_div(&nonzero_count(
                    &loss_mask.f_to_kind(kind)?.f_sum(None::<Kind>)?,
                )?)?,
            };
            Ok(loss.f_mul_scalar(dp)?)
        }
        LossAggMode::SeqMeanTokenSumNorm if opts.release.seq_sum_norm_over_batch() => {
            let scale = opts.loss_scale_factor.unwrap_or(len as f64);
            if scale <= 0.0 {
                return Err(AlgoError::Data(
                    "seq-mean-token-sum-norm over an empty response dimension".into(),
                ));
            }
            let per_batch = agg_loss(loss_mat, loss_mask, LossAggMode::SeqMeanTokenSum, opts)?;
            Ok(per_batch.f_div_scalar(scale)?)
        }
        LossAggMode::SeqMeanTokenSum | LossAggMode::SeqMeanTokenMean => {
            let tokens =
                loss_mask
                    .f_to_kind(kind)?
                    .f_sum_dim_intlist(-1i64, false, None::<Kind>)?;
            let mut seq_losses = masked_sum_dim(loss_mat, loss_mask, -1)?;
            if mode == LossAggMode::SeqMeanTokenMean {
                seq_losses = seq_losses.f_div(&tokens.f_add_scalar(MEAN_EPS)?)?;
            }
            let seq_mask = tokens.f_gt(0.0)?.f_to_kind(kind)?;
            let total = masked_sum(&seq_losses, &seq_mask)?;
            let loss = match opts.global_batch_size {
                Some(b) => total.f_div_scalar(b)?,
                None => total.f_div(&nonzero_count(&seq_mask.f_sum(None::<Kind>)?)?)?,
            };
            Ok(loss.f_mul_scalar(dp)?)
        }
        LossAggMode::SeqMeanTokenSumNorm => {
            let scale = opts.loss_scale_factor.unwrap_or(len as f64);
            if scale <= 0.0 {
                return Err(AlgoError::Data(
                    "seq-mean-token-sum-norm over an empty response dimension".into(),
                ));
            }
            Ok(masked_sum(loss_mat, loss_mask)?.f_div_scalar(scale)?)
        }
        LossAggMode::TokenSum => Ok(masked_sum(loss_mat, loss_mask)?.f_mul_scalar(dp)?),
    }
}
