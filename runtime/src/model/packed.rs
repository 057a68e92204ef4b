//! Packed sequences (verl's `use_remove_padding`): the valid tokens of a padded `(B, T)` batch
//! laid end to end as one row `(1, N)`, so embeddings, projections, MLPs and heads compute no
//! padding, and attention runs sequence by sequence over each row's own tokens.
//!
//! A token attends the valid tokens of its row up to itself, in the padded layout (through the
//! padding mask) and in the packed one (causally within its span) alike, so both layouts give
//! the same hidden state for every valid token; padding positions have no packed token and
//! their outputs are zero.
//!
//! [`Packing`] holds where each valid token sits; [`PackedWindow`] picks the tokens a head reads
//! (those predicting the response, [`super::decoder::Model::forward_window`]'s window) and
//! scatters per-token head outputs back to `(B, R)`.

use tch::{Device, Kind, Tensor};

use super::eager_attention::AttentionVariant;

/// The padding share of a micro-batch below which packing does not pay: gathering the valid
/// tokens and scattering the outputs back cost more than the padding they save (measured on
/// the quickstart, whose batches are about 1% padding: packed steps 12% slower on a 2-core
/// EPYC). Both layouts compute the same numbers.
pub const MIN_PADDING_TO_PACK: f64 = 0.1;

/// Whether `attention_mask` `(B, T)` has enough padding for packing to save compute.
pub fn worth_packing(attention_mask: &Tensor) -> bool {
    let total = attention_mask.numel() as f64;
    let valid = attention_mask
        .f_sum(Kind::Double)
        .and_then(|s| s.f_double_value(&[]))
        .unwrap_or(total);
    total > 0.0 && 1.0 - valid / total >= MIN_PADDING_TO_PACK
}

/// A run of packed tokens: `len` tokens from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub offset: i64,
    pub len: i64,
}

/// What one sequence's attention reads: its queries (in the query tensor's coordinates) and
/// its keys (in the key tensor's), the queries being the last `query.len` of the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionSpan {
    pub query: Span,
    pub key: Span,
}

/// The valid tokens of a padded batch, packed row by row.
#[derive(Debug)]
pub struct Packing {
    /// `(N,)` flat indices `row * T + position` of the valid tokens, row-major.
    pub tokens: Tensor,
    /// Each row's tokens in the packed order (empty rows have `len` 0).
    pub rows: Vec<Span>,
    /// Each valid token's position in its padded row, in packed order.
    positions: Vec<i64>,
    width: i64,
}

impl Packing {
    /// Packs by `attention_mask` `(B, T)` (1 for real tokens).
    pub fn new(attention_mask: &Tensor) -> Result<Self, String> {
        let size = attention_mask.size();
        let [b, t] = size[..] else {
            return Err(format!("attention_mask must be (B, T), got {size:?}"));
        };
        let flat = attention_mask
            .f_to_kind(Kind::Int64)
            .and_then(|m| m.f_to_device(Device::Cpu))
            .and_then(|m| m.f_reshape([-1]))
            .map_err(|e| e.to_string())?;
        let mask = Vec::<i64>::try_from(&flat).map_err(|e| e.to_string())?;
        let (mut index, mut positions, mut rows) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..b {
            let offset = index.len() as i64;
            for p in 0..t {
                if mask[(r * t + p) as usize] != 0 {
                    index.push(r * t + p);
                    positions.push(p);
                }
            }
            rows.push(Span {
                offset,
                len: index.len() as i64 - offset,
            });
        }
        let tokens = Tensor::from_slice(&index).to_device(attention_mask.device());
        Ok(Packing {
            tokens,
            rows,
            positions,
            width: t,
        })
    }

    /// Valid tokens in the batch (`N`).
    pub fn len(&self) -> i64 {
        self.positions.len() as i64
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// `x` `(B, T, …)` packed to `(1, N, …)`.
    pub fn pack(&self, x: &Tensor) -> Tensor {
        let s = x.size();
        let mut flat = vec![s[0] * s[1]];
        flat.extend_from_slice(&s[2..]);
        x.reshape(&flat[..])
            .index_select(0, &self.tokens)
            .unsqueeze(0)
    }

    /// Causal attention of every token over its own row.
    pub fn attention_spans(&self) -> Vec<AttentionSpan> {
        self.rows
            .iter()
            .filter(|s| s.len > 0)
            .map(|&s| AttentionSpan { query: s, key: s })
            .collect()
    }

    /// The tokens at padded positions `[start, start + len)`: what a head reading that window
    /// of every row needs.
    pub fn window(&self, start: i64, len: i64) -> PackedWindow {
        let (mut picked, mut dest, mut labels, mut spans) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (row, span) in self.rows.iter().enumerate() {
            let row = row as i64;
            let first = picked.len() as i64;
            let mut first_key = None;
            for k in span.offset..span.offset + span.len {
                let p = self.positions[k as usize];
                if p >= start && p < start + len {
                    first_key.get_or_insert(k);
                    picked.push(k);
                    dest.push(row * len + p - start);
                    labels.push(row * self.width + p + 1);
                }
            }
            if let Some(q0) = first_key {
                let n = picked.len() as i64 - first;
                spans.push(AttentionSpan {
                    query: Span {
                        offset: first,
                        len: n,
                    },
                    key: Span {
                        offset: span.offset,
                        len: q0 - span.offset + n,
                    },
                });
            }
        }
        let device = self.tokens.device();
        let tensor = |v: &[i64]| Tensor::from_slice(v).to_device(device);
        PackedWindow {
            tokens: tensor(&picked),
            token_list: picked,
            dest: tensor(&dest),
            labels: tensor(&labels),
            spans,
            rows: self.rows.len() as i64,
            len,
        }
    }
}

/// The packed tokens at one window of positions of every row (see [`Packing::window`]).
#[derive(Debug)]
pub struct PackedWindow {
    /// `(M,)` indices into the packed tokens, in packed order.
    pub tokens: Tensor,
    token_list: Vec<i64>,
    /// `(M,)` flat indices `row * len + (position - start)` into the `(B, len)` output.
    pub dest: Tensor,
    /// `(M,)` flat indices `row * T + position + 1` of the token each one predicts.
    pub labels: Tensor,
    /// Per non-empty row: its window tokens (queries, among the `M`) and the packed tokens
    /// they attend (keys, among the `N`).
    pub spans: Vec<AttentionSpan>,
    rows: i64,
    len: i64,
}

impl PackedWindow {
    /// [`PackedWindow::tokens`] on the host.
    pub fn token_list(&self) -> &[i64] {
        &self.token_list
    }

    /// The labels `(1, M)` of the window tokens: the next token of each in `input_ids` `(B, T)`.
    pub fn labels(&self, input_ids: &Tensor) -> Tensor {
        input_ids
            .reshape([-1])
            .index_select(0, &self.labels)
            .unsqueeze(0)
    }

    /// Per-token values `(1, M, …)` scattered to `(B, len, …)`, zero where a row has no valid
    /// token; differentiable in `values`.
    pub fn unpack(&self, values: &Tensor) -> Tensor {
        let s = values.size();
        let mut flat = vec![self.rows * self.len];
        flat.extend_from_slice(&s[2..]);
        let m = values.reshape(&[&[s[1]], &s[2..]].concat()[..]);
        let out = Tensor::zeros(&flat[..], (values.kind(), values.device()));
        let mut shape = vec![self.rows, self.len];
        shape.extend_from_slice(&s[2..]);
        out.index_copy(0, &self.dest, &m).reshape(&shape[..])
    }
}

/// Causal attention over packed tokens, sequence by sequence: `q` `(1, H, M, D)`, `k`, `v`
/// `(1, KV, N, D)`; returns `(1, H, M, D)` with zeros for queries outside every span. Each
/// span's queries are the last of its keys (bottom-right causal alignment). A layer with
/// sinks or a window (`variant`) attends in full ([`super::eager_attention`]).
///
/// Spans of equal query and key lengths run as one batched attention call (RL batches repeat
/// a few lengths: same-length prompts, responses cut at the limit), so the number of calls is
/// the number of distinct lengths, not of sequences.
pub fn attend_spans(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spans: &[AttentionSpan],
    variant: &AttentionVariant,
) -> Tensor {
    let device = q.device();
    let mut groups: std::collections::BTreeMap<(i64, i64), Vec<&AttentionSpan>> =
        std::collections::BTreeMap::new();
    for s in spans.iter().filter(|s| s.query.len > 0) {
        groups.entry((s.query.len, s.key.len)).or_default().push(s);
    }
    let (h, d) = (q.size()[1], q.size()[3]);
    let kv = k.size()[1];
    let gqa = h != kv;
    let mut out = q.zeros_like();
    for ((lq, lk), members) in groups {
        let g = members.len() as i64;
        let rows = |pick: fn(&AttentionSpan) -> Span| {
            let idx: Vec<i64> = members
                .iter()
                .flat_map(|s| {
                    let span = pick(s);
                    span.offset..span.offset + span.len
                })
                .collect();
            Tensor::from_slice(&idx).to_device(device)
        };
        let (qi, ki) = (rows(|s| s.query), rows(|s| s.key));
        // (1, heads, G·L, D) -> (G, heads, L, D)
        let batch = |x: &Tensor, idx: &Tensor, heads: i64, len: i64| {
            x.index_select(2, idx)
                .view([heads, g, len, d])
                .transpose(0, 1)
        };
        let (qs, ks, vs) = (
            batch(q, &qi, h, lq),
            batch(k, &ki, kv, lk),
            batch(v, &ki, kv, lk),
        );
        let y = if !variant.is_plain() {
            super::eager_attention::attend(&qs, &ks, &vs, None, variant)
        } else if lq == lk {
            Tensor::scaled_dot_product_attention(
                &qs,
                &ks,
                &vs,
                None::<Tensor>,
                0.0,
                true,
                None,
                gqa,
            )
        } else {
            // Query j (of L) is key j + (S - L): it sees keys up to there.
            let qpos = Tensor::arange(lq, (Kind::Int64, device)).view([-1, 1]) + (lk - lq);
            let kpos = Tensor::arange(lk, (Kind::Int64, device)).view([1, -1]);
            let mask = kpos.le_tensor(&qpos);
            Tensor::scaled_dot_product_attention(&qs, &ks, &vs, Some(mask), 0.0, false, None, gqa)
        };
        let y = y.transpose(0, 1).reshape([1, h, g * lq, d]);
        out = out.index_copy(2, &qi, &y);
    }
    out
}
