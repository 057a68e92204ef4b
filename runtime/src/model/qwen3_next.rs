//! Qwen3-Next's checkpoint layout. Its layers are Qwen3.5's (Gated DeltaNet among gated
//! attention, routed experts plus a gated shared expert); only the DeltaNet's input
//! projections are stored fused and grouped by key head:
//!
//! - `linear_attn.in_proj_qkvz` holds, for each key head in turn, its query and key rows
//!   (`d_k` each), then the value and output-gate rows of the `r = value_heads / key_heads`
//!   value heads it serves (`r * d_v` each);
//! - `linear_attn.in_proj_ba` holds, for each key head, the `r` write-strength (`b`) rows,
//!   then the `r` decay (`a`) rows.
//!
//! The model holds Qwen3.5's projections (`in_proj_qkv` with every query, then every key,
//! then every value; `in_proj_z`, `in_proj_b`, `in_proj_a`): [`FusedProjections::split`]
//! turns a checkpoint tensor into them on load, [`FusedProjections::fuse`] back on save, so
//! a trained model is again a checkpoint transformers and vLLM read.
use tch::Tensor;

use super::ModelConfig;

const QKVZ: &str = "linear_attn.in_proj_qkvz.weight";
const BA: &str = "linear_attn.in_proj_ba.weight";
const QKV: &str = "linear_attn.in_proj_qkv.weight";
const Z: &str = "linear_attn.in_proj_z.weight";
const B: &str = "linear_attn.in_proj_b.weight";
const A: &str = "linear_attn.in_proj_a.weight";

/// The head sizes that place the rows of the fused projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedProjections {
    key_heads: i64,
    value_heads: i64,
    key_dim: i64,
    value_dim: i64,
}

impl FusedProjections {
    /// The layout of `cfg`'s checkpoint: `Some` for Qwen3-Next, `None` for every family
    /// stored as it is held.
    pub fn of(cfg: &ModelConfig) -> Option<Self> {
        if cfg.model_type != "qwen3_next" {
            return None;
        }
        let l = &cfg.linear;
        let fused = FusedProjections {
            key_heads: l.linear_num_key_heads,
            value_heads: l.linear_num_value_heads,
            key_dim: l.linear_key_head_dim,
            value_dim: l.linear_value_head_dim,
        };
        (fused.key_heads > 0 && fused.value_heads % fused.key_heads == 0).then_some(fused)
    }

    /// Value heads per key head.
    fn per_key(&self) -> i64 {
        self.value_heads / self.key_heads
    }

    /// Whether checkpoint tensor `name` is one of the fused projections.
    pub fn is_fused(name: &str) -> bool {
        name.ends_with(QKVZ) || name.ends_with(BA)
    }

    /// The held tensors of checkpoint tensor `name` (itself when it is not fused).
    pub fn split(&self, name: &str, t: &Tensor) -> Result<Vec<(String, Tensor)>, String> {
        let (nk, r, dk, dv) = (self.key_heads, self.per_key(), self.key_dim, self.value_dim);
        let rows = |want: i64| -> Result<i64, String> {
            let size = t.size();
            match size.as_slice() {
                [n, h] if *n == want => Ok(*h),
                _ => Err(format!(
                    "`{name}` has shape {size:?}; this config's heads need {want} rows"
                )),
            }
        };
        if let Some(prefix) = name.strip_suffix(QKVZ) {
            let h = rows(nk * (2 * dk + 2 * r * dv))?;
            let parts = t
                .reshape([nk, 2 * dk + 2 * r * dv, h])
                .split_with_sizes([dk, dk, r * dv, r * dv], 1);
            let flat = |x: &Tensor, n: i64| x.reshape([n, h]);
            let qkv = Tensor::cat(
                &[
                    flat(&parts[0], nk * dk),
                    flat(&parts[1], nk * dk),
                    flat(&parts[2], nk * r * dv),
                ],
                0,
            );
            return Ok(vec![
                (format!("{prefix}{QKV}"), qkv),
                (format!("{prefix}{Z}"), flat(&parts[3], nk * r * dv)),
            ]);
        }
        if let Some(prefix) = name.strip_suffix(BA) {
            let h = rows(nk * 2 * r)?;
            let parts = t.reshape([nk, 2 * r, h]).split_with_sizes([r, r], 1);
            return Ok(vec![
                (format!("{prefix}{B}"), parts[0].reshape([nk * r, h])),
                (format!("{prefix}{A}"), parts[1].reshape([nk * r, h])),
            ]);
        }
        Ok(vec![(name.to_owned(), t.shallow_clone())])
    }

    /// `named` (held tensors) in the checkpoint's layout: each layer's four projections
    /// fused into two, in place of the first of them; everything else unchanged.
    pub fn fuse(&self, named: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>, String> {
        let (nk, r, dk, dv) = (self.key_heads, self.per_key(), self.key_dim, self.value_dim);
        let find = |prefix: &str, leaf: &str| -> Result<Tensor, String> {
            let want = format!("{prefix}{leaf}");
            named
                .iter()
                .find(|(n, _)| *n == want)
                .map(|(_, t)| t.shallow_clone())
                .ok_or_else(|| format!("`{want}` is missing; Qwen3-Next stores it fused"))
        };
        let hidden = |t: &Tensor| t.size().last().copied().unwrap_or(0);
        let mut out = Vec::with_capacity(named.len());
        for (name, t) in named {
            if let Some(prefix) = name.strip_suffix(QKV) {
                let (z, h) = (find(prefix, Z)?, hidden(t));
                let per_key = |x: &Tensor, rows: i64| x.reshape([nk, rows, h]);
                let parts = t.split_with_sizes([nk * dk, nk * dk, nk * r * dv], 0);
                let qkvz = Tensor::cat(
                    &[
                        per_key(&parts[0], dk),
                        per_key(&parts[1], dk),
                        per_key(&parts[2], r * dv),
                        per_key(&z, r * dv),
                    ],
                    1,
                )
                .reshape([-1, h]);
                out.push((format!("{prefix}{QKVZ}"), qkvz));
            } else if let Some(prefix) = name.strip_suffix(B) {
                let (a, h) = (find(prefix, A)?, hidden(t));
                let ba = Tensor::cat(&[t.reshape([nk, r, h]), a.reshape([nk, r, h])], 1)
                    .reshape([-1, h]);
                out.push((format!("{prefix}{BA}"), ba));
            } else if !(name.ends_with(Z) || name.ends_with(A)) {
                out.push((name.clone(), t.shallow_clone()));
            }
        }
        Ok(out)
    }
}
