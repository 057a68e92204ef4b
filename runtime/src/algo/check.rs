//! Input validation shared by the algorithm functions: shapes, devices and kinds become
//! [`AlgoError`]s before any tensor op runs.
use tch::{Device, Kind, Tensor};

use super::{AlgoError, Result};

/// Checks that `t` is 2-D and returns `(batch, response_len)`.
pub(crate) fn dims2(t: &Tensor, name: &'static str) -> Result<(i64, i64)> {
    match t.size().as_slice() {
        &[b, l] => Ok((b, l)),
        other => Err(AlgoError::Shape {
            name,
            expected: "[batch, response_len]".into(),
            got: other.to_vec(),
        }),
    }
}

/// Checks that `t` has exactly `shape`.
pub(crate) fn shape(t: &Tensor, name: &'static str, shape: &[i64]) -> Result<()> {
    let got = t.size();
    if got != shape {
        return Err(AlgoError::Shape {
            name,
            expected: format!("{shape:?}"),
            got,
        });
    }
    Ok(())
}

/// Checks that `t` lives on `device` (the device of `reference`).
pub(crate) fn device(
    t: &Tensor,
    name: &'static str,
    reference: &'static str,
    device: Device,
) -> Result<()> {
    let got = t.device();
    if got != device {
        return Err(AlgoError::Device {
            name,
            reference,
            expected: device,
            got,
        });
    }
    Ok(())
}

/// Checks that `t` holds floating-point values.
pub(crate) fn floating(t: &Tensor, name: &'static str) -> Result<Kind> {
    let kind = t.f_kind()?;
    if !t.is_floating_point() {
        return Err(AlgoError::Kind { name, kind });
    }
    Ok(kind)
}

/// Checks that every `(tensor, name)` has the shape and device of the first one, which must be
/// `[batch, response_len]`; returns that shape.
pub(crate) fn same_2d(tensors: &[(&Tensor, &'static str)]) -> Result<(i64, i64)> {
    let Some(&(first, first_name)) = tensors.first() else {
        return Err(AlgoError::Data("no tensors given".into()));
    };
    let (b, l) = dims2(first, first_name)?;
    let dev = first.device();
    for &(t, name) in &tensors[1..] {
        shape(t, name, &[b, l])?;
        device(t, name, first_name, dev)?;
    }
    Ok((b, l))
}
