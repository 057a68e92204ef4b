//! Host-side `[batch, response_len]` buffers in f64: advantage estimation runs without autograd
//! on small per-batch data, so the estimators are written as plain loops over these.
use tch::{Device, Kind, Tensor};

use crate::algo::masked::{MEAN_EPS, WHITEN_EPS};
use crate::algo::{AlgoError, Result};

/// A row-major `[batch, len]` matrix of f64.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rows {
    pub batch: usize,
    pub len: usize,
    pub data: Vec<f64>,
}

/// Every element of `t`, row-major, as f64 on the host.
pub(crate) fn host_vec(t: &Tensor) -> Result<Vec<f64>> {
    let flat = t
        .f_to_kind(Kind::Double)?
        .f_to_device(Device::Cpu)?
        .f_contiguous()?
        .f_view([-1i64])?;
    Ok(Vec::<f64>::try_from(&flat)?)
}

impl Rows {
    /// Copies a `[batch, len]` tensor (shape checked by the caller).
    pub fn from_tensor(t: &Tensor, batch: i64, len: i64) -> Result<Rows> {
        let data = host_vec(t)?;
        let (batch, len) = (batch as usize, len as usize);
        if data.len() != batch * len {
            return Err(AlgoError::Data(format!(
                "expected {} elements, got {}",
                batch * len,
                data.len()
            )));
        }
        Ok(Rows { batch, len, data })
    }

    pub fn zeros(batch: usize, len: usize) -> Rows {
        Rows {
            batch,
            len,
            data: vec![0.0; batch * len],
        }
    }

    pub fn get(&self, i: usize, t: usize) -> f64 {
        self.data[i * self.len + t]
    }

    pub fn set(&mut self, i: usize, t: usize, v: f64) {
        self.data[i * self.len + t] = v;
    }

    pub fn row(&self, i: usize) -> &[f64] {
        &self.data[i * self.len..(i + 1) * self.len]
    }

    /// `Σ_t x_{i,t}` per row.
    pub fn row_sums(&self) -> Vec<f64> {
        (0..self.batch).map(|i| self.row(i).iter().sum()).collect()
    }

    /// Elementwise `f(self, other)`.
    pub fn zip(&self, other: &Rows, f: impl Fn(f64, f64) -> f64) -> Rows {
        let data = self
            .data
            .iter()
            .zip(&other.data)
            .map(|(&a, &b)| f(a, b))
            .collect();
        Rows {
            batch: self.batch,
            len: self.len,
            data,
        }
    }

    /// A `[batch, len]` tensor of `kind` on `device`.
    pub fn to_tensor(&self, kind: Kind, device: Device) -> Result<Tensor> {
        let t = Tensor::f_from_slice(&self.data)?.f_view([self.batch as i64, self.len as i64])?;
        Ok(t.f_to_kind(kind)?.f_to_device(device)?)
    }
}

/// `A_{i,t} = a_i · m_{i,t}`: one scalar per sequence, broadcast over its valid tokens.
pub(crate) fn broadcast(scalars: &[f64], mask: &Rows) -> Rows {
    let mut out = Rows::zeros(mask.batch, mask.len);
    for (i, &a) in scalars.iter().enumerate().take(mask.batch) {
        for t in 0..mask.len {
            out.set(i, t, a * mask.get(i, t));
        }
    }
    out
}

/// verl's `masked_whiten`: `(x − mean_m x) / sqrt(var_m x + 1e-8)` with the masked mean
/// (`Σ m x / (Σm + 1e-8)`) and the unbiased masked variance; applied to every element.
/// An error when fewer than two elements are valid.
pub(crate) fn masked_whiten(values: &Rows, mask: &Rows) -> Result<Rows> {
    let n: f64 = mask.data.iter().sum();
    if n <= 1.0 {
        return Err(AlgoError::Data(format!(
            "whitening needs more than one valid token, the response mask sums to {n} \
             (use a larger batch)"
        )));
    }
    let masked_mean = |f: &dyn Fn(f64) -> f64| -> f64 {
        let s: f64 = values
            .data
            .iter()
            .zip(&mask.data)
            .map(|(&v, &m)| if m != 0.0 { f(v) * m } else { 0.0 })
            .sum();
        s / (n + MEAN_EPS)
    };
    let mean = masked_mean(&|v| v);
    let var = masked_mean(&|v| (v - mean) * (v - mean)) * n / (n - 1.0);
    let scale = 1.0 / (var + WHITEN_EPS).sqrt();
    let data = values.data.iter().map(|&v| (v - mean) * scale).collect();
    Ok(Rows {
        batch: values.batch,
        len: values.len,
        data,
    })
}
