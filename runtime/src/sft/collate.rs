//! Tokenized conversations as the engine's batch: right-padded rows whose "responses" are every
//! token after the first, so the causal-LM head's per-response-token log-probabilities are
//! `log p(token t | tokens < t)` for `t ≥ 1`, and the loss mask (shifted with them) picks the
//! assistant replies' tokens. Padding positions carry no loss and, with `use_remove_padding`,
//! are never computed.

use tch::{Kind, Tensor};

use crate::data::sft::SftExample;
use crate::engine::Batch;

use super::super::trainer::TrainerError;

/// The batch of `rows` padded with `pad_id` to the longest: `input_ids`, `attention_mask`,
/// `position_ids` `(N, T)`, `responses` and `response_mask` `(N, T - 1)`.
pub fn collate(rows: &[&SftExample], pad_id: i64) -> Result<Batch, TrainerError> {
    let width = rows.iter().map(|r| r.input_ids.len()).max().unwrap_or(0);
    if rows.is_empty() || width < 2 {
        return Err(TrainerError::Config(format!(
            "an SFT batch needs conversations of at least 2 tokens ({} rows, longest {width})",
            rows.len()
        )));
    }
    let n = rows.len();
    let mut ids = vec![pad_id; n * width];
    let mut attention = vec![0i64; n * width];
    let mut positions = vec![1i64; n * width];
    let mut loss = vec![0f32; n * width];
    for (i, row) in rows.iter().enumerate() {
        let base = i * width;
        for (t, (&id, &m)) in row.input_ids.iter().zip(&row.loss_mask).enumerate() {
            ids[base + t] = id;
            attention[base + t] = 1;
            positions[base + t] = t as i64;
            loss[base + t] = f32::from(u8::from(m));
        }
    }
    let shape = [n as i64, width as i64];
    let input_ids = Tensor::from_slice(&ids).f_reshape(shape)?;
    let loss_mask = Tensor::from_slice(&loss).f_reshape(shape)?;
    let t = width as i64;
    let mut batch = Batch::new();
    batch.insert("responses", input_ids.f_narrow(1, 1, t - 1)?)?;
    batch.insert(
        "response_mask",
        loss_mask.f_narrow(1, 1, t - 1)?.f_to_kind(Kind::Float)?,
    )?;
    batch.insert("input_ids", input_ids)?;
    batch.insert(
        "attention_mask",
        Tensor::from_slice(&attention).f_reshape(shape)?,
    )?;
    batch.insert(
        "position_ids",
        Tensor::from_slice(&positions).f_reshape(shape)?,
    )?;
    Ok(batch)
}

/// Valid tokens of each row (what verl's dynamic batch size balances).
pub fn row_lengths(rows: &[&SftExample]) -> Vec<i64> {
    rows.iter().map(|r| r.input_ids.len() as i64).collect()
}
