//! [`Batch`]: named tensors that share their first dimension (verl's `DataProto.batch`, a
//! `TensorDict`), with the row operations the workers need: select, narrow, split, concat.
//! A vision-language batch also carries each row's images (verl's `multi_modal_data`, a
//! non-tensor column), which follow the rows through every operation.

use std::collections::BTreeMap;
use std::sync::Arc;

use tch::{Kind, Tensor};

use super::EngineError;
use crate::model::vision::ProcessedImage;

/// A row's images (its prompt's, in placeholder order), shared by the rows of one prompt.
pub type RowImages = Arc<[ProcessedImage]>;

/// The tensors that span the whole (left-padded prompt + response) sequence.
pub const SEQUENCE_KEYS: [&str; 3] = ["input_ids", "attention_mask", "position_ids"];

/// Named tensors with the same number of rows.
#[derive(Debug, Default)]
pub struct Batch {
    tensors: BTreeMap<String, Tensor>,
    rows: Option<i64>,
    /// Per row, its images; empty when the batch has none.
    images: Vec<RowImages>,
}

impl Batch {
    pub fn new() -> Self {
        Batch::default()
    }

    /// Adds (or replaces) `name`; its first dimension must match the other tensors'.
    pub fn insert(&mut self, name: &str, t: Tensor) -> Result<(), EngineError> {
        let size = t.size();
        let Some(&rows) = size.first() else {
            return Err(EngineError::Batch(format!(
                "`{name}` is a 0-d tensor; batch tensors need a row dimension"
            )));
        };
        match self.rows {
            Some(r)
                if r != rows && !(self.tensors.len() == 1 && self.tensors.contains_key(name)) =>
            {
                return Err(EngineError::Batch(format!(
                    "`{name}` has {rows} rows, the batch has {r}"
                )));
            }
            _ => self.rows = Some(rows),
        }
        self.tensors.insert(name.to_owned(), t);
        Ok(())
    }

    /// Builder form of [`Batch::insert`].
    pub fn with(mut self, name: &str, t: Tensor) -> Result<Self, EngineError> {
        self.insert(name, t)?;
        Ok(self)
    }

    /// The tensor `name`, or an error naming what is missing.
    pub fn get(&self, name: &str) -> Result<&Tensor, EngineError> {
        self.tensors.get(name).ok_or_else(|| {
            EngineError::Batch(format!(
                "the batch has no `{name}` (it has: {})",
                self.tensors.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
    }

    pub fn opt(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        let t = self.tensors.remove(name);
        if self.tensors.is_empty() {
            self.rows = None;
        }
        t
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Number of rows (0 for an empty batch).
    pub fn rows(&self) -> i64 {
        self.rows.unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Sets each row's images (one entry per row).
    pub fn set_images(&mut self, images: Vec<RowImages>) -> Result<(), EngineError> {
        if images.len() as i64 != self.rows() {
            return Err(EngineError::Batch(format!(
                "images for {} rows, the batch has {}",
                images.len(),
                self.rows()
            )));
        }
        self.images = images;
        Ok(())
    }

    /// Each row's images; empty when the batch has none.
    pub fn images(&self) -> &[RowImages] {
        &self.images
    }

    /// Every image of the batch in row order (the order of their placeholders).
    pub fn all_images(&self) -> Vec<&ProcessedImage> {
        self.images.iter().flat_map(|r| r.iter()).collect()
    }

    fn map(
        &self,
        f: impl Fn(&Tensor) -> Result<Tensor, tch::TchError>,
    ) -> Result<Batch, EngineError> {
        let mut out = Batch::new();
        for (k, t) in &self.tensors {
            out.insert(k, f(t)?)?;
        }
        Ok(out)
    }

    /// The rows `index` (an int64 tensor or a list), in that order.
    pub fn select(&self, index: &[i64]) -> Result<Batch, EngineError> {
        if let Some(&bad) = index.iter().find(|&&i| i < 0 || i >= self.rows()) {
            return Err(EngineError::Batch(format!(
                "row {bad} out of range (batch of {})",
                self.rows()
            )));
        }
        let idx = Tensor::from_slice(index);
        let mut out = self.map(|t| t.f_index_select(0, &idx.to_device(t.device())))?;
        if !self.images.is_empty() {
            out.images = index
                .iter()
                .map(|&i| self.images[i as usize].clone())
                .collect();
        }
        Ok(out)
    }

    /// The same tensors (shared storage) under the same names.
    pub fn shallow_clone(&self) -> Batch {
        Batch {
            tensors: self
                .tensors
                .iter()
                .map(|(k, t)| (k.clone(), t.shallow_clone()))
                .collect(),
            rows: self.rows,
            images: self.images.clone(),
        }
    }

    /// Rows `start .. start + len`.
    pub fn narrow(&self, start: i64, len: i64) -> Result<Batch, EngineError> {
        if start < 0 || len < 0 || start + len > self.rows() {
            return Err(EngineError::Batch(format!(
                "rows {start}..{} out of range (batch of {})",
                start + len,
                self.rows()
            )));
        }
        let mut out = self.map(|t| t.f_narrow(0, start, len))?;
        if !self.images.is_empty() {
            out.images = self.images[start as usize..(start + len) as usize].to_vec();
        }
        Ok(out)
    }

    /// The batch without the leading sequence positions that are padding in every row.
    ///
    /// Prompts are left-padded to `data.max_prompt_length` for the whole batch; a
    /// micro-batch whose longest prompt is shorter computes those columns for nothing (the
    /// quickstart's 13-token prompts sit in 32 columns: half of every forward). Only the
    /// tensors spanning the whole sequence ([`SEQUENCE_KEYS`]) lose the columns; response-
    /// aligned tensors (`responses`, `response_mask`, advantages, log-probs) are the last
    /// columns and stay as they are. Masked positions never reach a valid token's attention
    /// and positions come from `position_ids`, so the valid tokens compute the same values.
    pub fn without_shared_left_padding(&self) -> Result<Batch, EngineError> {
        let Some(mask) = self.opt("attention_mask") else {
            return Ok(self.shallow_clone());
        };
        let width = mask.size().get(1).copied().unwrap_or(0);
        // The first column any row uses (`width` when no row uses any).
        let used = mask.f_ne(0)?.f_any_dims(Some(&[0i64][..]), false)?;
        let first = used
            .f_to_kind(Kind::Int64)?
            .f_argmax(0, false)?
            .f_int64_value(&[])?;
        let any_used = used.f_any()?.f_int64_value(&[])? != 0;
        let drop = if any_used { first } else { 0 };
        if drop <= 0 {
            return Ok(self.shallow_clone());
        }
        let mut out = Batch::new();
        for (k, t) in &self.tensors {
            let spans_sequence =
                SEQUENCE_KEYS.contains(&k.as_str()) && t.size().get(1).copied() == Some(width);
            let t = if spans_sequence {
                t.f_narrow(1, drop, width - drop)?
            } else {
                t.shallow_clone()
            };
            out.insert(k, t)?;
        }
        out.images = self.images.clone();
        Ok(out)
    }

    /// Consecutive chunks of `size` rows (the last may be smaller).
    pub fn split(&self, size: usize) -> Result<Vec<Batch>, EngineError> {
        if size == 0 {
            return Err(EngineError::Batch(
                "cannot split a batch into chunks of 0 rows".into(),
            ));
        }
        let (n, size) = (self.rows(), size as i64);
        let mut out = Vec::new();
        let mut start = 0;
        while start < n {
            let len = size.min(n - start);
            out.push(self.narrow(start, len)?);
            start += len;
        }
        Ok(out)
    }

    /// Concatenates batches with the same names along rows.
    pub fn cat(parts: &[Batch]) -> Result<Batch, EngineError> {
        let Some(first) = parts.first() else {
            return Ok(Batch::new());
        };
        let mut out = Batch::new();
        for name in first.tensors.keys() {
            let ts: Vec<&Tensor> = parts
                .iter()
                .map(|p| p.get(name))
                .collect::<Result<_, _>>()?;
            out.insert(name, Tensor::f_cat(&ts, 0)?)?;
        }
        if parts.iter().any(|p| !p.images.is_empty()) {
            if parts.iter().any(|p| p.images.is_empty() && p.rows() > 0) {
                return Err(EngineError::Batch(
                    "cannot concatenate batches with images and batches without".into(),
                ));
            }
            out.images = parts.iter().flat_map(|p| p.images.clone()).collect();
        }
        Ok(out)
    }

    /// Valid response tokens (`Σ response_mask`) of the batch.
    pub fn num_tokens(&self) -> Result<f64, EngineError> {
        Ok(self
            .get("response_mask")?
            .f_sum(Kind::Double)?
            .f_double_value(&[])?)
    }

    /// Rows with at least one valid response token.
    pub fn num_nonempty(&self) -> Result<f64, EngineError> {
        let m = self.get("response_mask")?;
        Ok(m.f_sum_dim_intlist(-1i64, false, Kind::Double)?
            .f_gt(0.0)?
            .f_sum(Kind::Double)?
            .f_double_value(&[])?)
    }
}
