//! What the vision towers share: their whole (adaptable) linear layers, 2-D rotary
//! embeddings on queries and keys, and bidirectional attention within spans of tokens (an
//! attention window, a frame).

use tch::nn::Path;
use tch::{Kind, Tensor};

use super::qwen2_5_vl::VisionError;
use crate::model::layers::{Adapters, Linear, Split};

/// A whole (not tensor-parallel) biased `in -> out` layer named `visual.{module}` under the
/// tower's root `p` (`module` a dotted path: `blocks.0.attn.qkv`), with a LoRA adapter where
/// `adapters` target it.
pub(super) fn tower_linear(
    p: &Path,
    module: &str,
    (i, o): (i64, i64),
    adapters: Option<Adapters<'_>>,
) -> Result<Linear, VisionError> {
    let at = module.split('.').fold(p.clone(), |at, part| at.sub(part));
    Linear::adapted(
        at,
        &format!("visual.{module}"),
        (i, o, true),
        (Split::Whole, 1),
        adapters,
    )
    .map_err(VisionError::Text)
}

/// The patch embedding of `pixel_values` `(Σ t·h·w, patch_width)` for the grids `grid_thw`:
/// a convolution whose kernel `(hidden, channels, t, p, p)` is the patch, so the linear map
/// of each row (with the kernel's `bias`, when the tower has one). The rows must be the
/// grids' patches, of the kernel's width.
pub(super) fn patch_embedding(
    pixel_values: &Tensor,
    grid_thw: &[[i64; 3]],
    kernel: &Tensor,
    bias: Option<&Tensor>,
) -> Result<Tensor, VisionError> {
    let hidden = kernel.size()[0];
    let patch = kernel.numel() as i64 / hidden.max(1);
    let want: i64 = grid_thw.iter().map(|[t, h, w]| t * h * w).sum();
    let size = pixel_values.size();
    if size.len() != 2 || size[0] != want || size[1] != patch {
        return Err(VisionError::Shape {
            rows: size.first().copied().unwrap_or(0),
            width: size.get(1).copied().unwrap_or(0),
            want,
            patch,
        });
    }
    let kernel = kernel.f_reshape([hidden, -1])?;
    Ok(pixel_values
        .f_to_kind(kernel.kind())?
        .f_linear(&kernel, bias)?)
}

/// `t` `(n, heads, d)` rotated by the tables `cos`, `sin` `(n, d)` (rotate-half, in fp32 and
/// back to `t`'s kind, as transformers' vision towers do).
pub(super) fn rotate(t: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, tch::TchError> {
    let kind = t.kind();
    let d = t.size().last().copied().unwrap_or(0);
    let tf = t.f_to_kind(Kind::Float)?;
    let half = d / 2;
    let rotated = Tensor::f_cat(
        &[
            tf.f_narrow(-1, half, d - half)?.f_neg()?,
            tf.f_narrow(-1, 0, half)?,
        ],
        -1,
    )?;
    let (cos, sin) = (cos.f_unsqueeze(1)?, sin.f_unsqueeze(1)?);
    (tf * cos + rotated * sin).f_to_kind(kind)
}

/// Attention of `q`, `k`, `v` `(n, heads, d)` where each token sees the tokens of its own span
/// (`spans`: token offsets, the first 0 and the last `n`), as `(n, heads, d)`. Consecutive
/// spans of one length attend as one batch (an image's windows are mostly equal): the same
/// attention per span as a loop over them, in a few calls.
pub(super) fn within_spans(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spans: &[i64],
) -> Result<Tensor, tch::TchError> {
    let (heads, d) = (q.size()[1], q.size()[2]);
    let lens: Vec<(i64, i64)> = spans
        .windows(2)
        .map(|w| (w[0], w[1] - w[0]))
        .filter(|&(_, len)| len > 0)
        .collect();
    let mut outs = Vec::with_capacity(lens.len());
    let mut i = 0;
    while i < lens.len() {
        let (start, len) = lens[i];
        let run = lens[i..].iter().take_while(|&&(_, l)| l == len).count() as i64;
        // (run, heads, len, d): every token sees its own span whole.
        let part = |t: &Tensor| {
            t.f_narrow(0, start, run * len)?
                .f_reshape([run, len, heads, d])?
                .f_transpose(1, 2)
        };
        let attn = Tensor::f_scaled_dot_product_attention::<Tensor>(
            &part(q)?,
            &part(k)?,
            &part(v)?,
            None,
            0.0,
            false,
            None,
            false,
        )?;
        outs.push(attn.f_transpose(1, 2)?.f_reshape([run * len, heads, d])?);
        i += run as usize;
    }
    Tensor::f_cat(&outs, 0)
}

/// Rotary angles `(tokens, head_dim / 2)` of the patches of `grid_thw`, each frame's patches
/// in `merge × merge` blocks (the merger's units), row-major: half of the angles by the
/// patch's row, half by its column (inverse frequencies over `head_dim / 2` dimensions, base
/// 10000), frames repeated.
pub(super) fn patch_angles(
    grid_thw: &[[i64; 3]],
    merge: i64,
    head_dim: i64,
) -> Result<Tensor, tch::TchError> {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half / 2)
        .map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / half as f32))
        .collect();
    let (mut rows, mut cols) = (Vec::new(), Vec::new());
    for &[t, h, w] in grid_thw {
        for _ in 0..t {
            for bh in 0..h / merge {
                for bw in 0..w / merge {
                    for ih in 0..merge {
                        for iw in 0..merge {
                            rows.push((bh * merge + ih) as f32);
                            cols.push((bw * merge + iw) as f32);
                        }
                    }
                }
            }
        }
    }
    let freq = Tensor::from_slice(&inv_freq).f_unsqueeze(0)?;
    let angle = |pos: &[f32]| -> Result<Tensor, tch::TchError> {
        Tensor::from_slice(pos).f_unsqueeze(1)?.f_mul(&freq)
    };
    Tensor::f_cat(&[angle(&rows)?, angle(&cols)?], 1)
}
