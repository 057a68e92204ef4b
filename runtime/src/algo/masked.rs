//! Masked reductions with verl's conventions (`verl/utils/torch_functional.py`): values outside
//! the mask never count (not even NaN), means divide by `Σm + 1e-8`, the variance is unbiased.
use tch::{Kind, Tensor};

use super::{AlgoError, Result};

/// Epsilon added to the mask count of a masked mean.
pub const MEAN_EPS: f64 = 1e-8;
/// Epsilon added to the variance before the inverse square root of whitening.
pub const WHITEN_EPS: f64 = 1e-8;

/// `(where(m ≠ 0, v, 0) · m, m)` with the mask converted to the values' kind.
fn masked_product(values: &Tensor, mask: &Tensor) -> Result<(Tensor, Tensor)> {
    let m = mask.f_to_kind(values.f_kind()?)?;
    let keep = m.f_ne(0.0)?;
    let v = values.f_where_scalarother(&keep, 0.0)?.f_mul(&m)?;
    Ok((v, m))
}

/// Σ m·v over every element (a 0-d tensor).
pub fn masked_sum(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    Ok(masked_product(values, mask)?.0.f_sum(None::<Kind>)?)
}

/// Σ m·v along `dim`.
pub fn masked_sum_dim(values: &Tensor, mask: &Tensor, dim: i64) -> Result<Tensor> {
    Ok(masked_product(values, mask)?
        .0
        .f_sum_dim_intlist(dim, false, None::<Kind>)?)
}

/// Σ m·v / (Σ m + 1e-8) over every element (a 0-d tensor).
pub fn masked_mean(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (v, m) = masked_product(values, mask)?;
    Ok(v.f_sum(None::<Kind>)?
        .f_div(&m.f_sum(None::<Kind>)?.f_add_scalar(MEAN_EPS)?)?)
}

/// Σ m·v / (Σ m + 1e-8) along `dim`.
pub fn masked_mean_dim(values: &Tensor, mask: &Tensor, dim: i64) -> Result<Tensor> {
    let (v, m) = masked_product(values, mask)?;
    let num = v.f_sum_dim_intlist(dim, false, None::<Kind>)?;
    Ok(num.f_div(
        &m.f_sum_dim_intlist(dim, false, None::<Kind>)?
            .f_add_scalar(MEAN_EPS)?,
    )?)
}

/// Unbiased masked variance: `masked_mean((v − mean)²) · n/(n − 1)` with `n = Σm`; an error
/// when `n ≤ 1`, as in verl.
pub fn masked_var(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let mean = masked_mean(values, mask)?;
    let centered = values.f_sub(&mean)?;
    let var = masked_mean(&centered.f_square()?, mask)?;
    let n = mask
        .f_to_kind(Kind::Double)?
        .f_sum(None::<Kind>)?
        .f_double_value(&[])?;
    if n <= 1.0 {
        return Err(AlgoError::Data(format!(
            "masked variance needs more than one valid element, the mask sums to {n}"
        )));
    }
    Ok(var.f_mul_scalar(n / (n - 1.0))?)
}

/// `(v − mean) / sqrt(var + 1e-8)` with masked mean and unbiased masked variance; every element
/// is transformed, masked ones included (verl's `masked_whiten` with `shift_mean=True`).
pub fn masked_whiten(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let mean = masked_mean(values, mask)?;
    let var = masked_var(values, mask)?;
    Ok(values
        .f_sub(&mean)?
        .f_mul(&var.f_add_scalar(WHITEN_EPS)?.f_rsqrt()?)?)
}
