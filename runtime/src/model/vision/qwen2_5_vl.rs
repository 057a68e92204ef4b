//! Qwen2.5-VL's vision tower (transformers' `Qwen2_5_VisionTransformerPretrainedModel`): the
//! image or video patches of a batch in, one embedding per merged patch out, in the order the
//! language model's vision placeholders take them.
//!
//! - Patches: each row of `pixel_values` is one `temporal_patch_size × patch_size²` patch of
//!   every channel, flattened channel first (the image processor's layout); the patch embedding
//!   is a convolution whose kernel is the patch, so it is the linear map of that row.
//! - Positions: 2-D rotary embeddings, half of each head's rotary dimensions by the patch's
//!   row, half by its column, with patches ordered in `spatial_merge_size²` blocks (the units
//!   the merger later fuses).
//! - Attention: bidirectional, within windows of `window_size` pixels (in merged units of
//!   `window_size / spatial_merge_size / patch_size`) except in the `fullatt_block_indexes`
//!   blocks, which attend over each image (or video frame sequence) whole. Tokens are permuted
//!   into window order before the blocks and back after the merger.
//! - Blocks: pre-norm (RMSNorm, eps 1e-6) attention with a fused, biased qkv projection, and a
//!   biased gated MLP (SiLU).
//! - Merger: RMSNorm, then `spatial_merge_size²` neighbouring patches concatenated and mapped by
//!   Linear, GELU, Linear to the language model's width.
//!
//! Weights are named as in the checkpoint under the tower's root (`visual.` in Qwen2.5-VL's
//! files): `patch_embed.proj.weight`, `blocks.{i}.{norm1,norm2}.weight`,
//! `blocks.{i}.attn.{qkv,proj}.{weight,bias}`, `blocks.{i}.mlp.{gate,up,down}_proj.{weight,bias}`,
//! `merger.ln_q.weight`, `merger.mlp.{0,2}.{weight,bias}`.

use serde::Deserialize;
use tch::Tensor;
use tch::nn::{Init, Path};

use super::attention;
use crate::model::layers::{Adapters, Linear, RmsNorm};

/// `vision_config` of a Qwen2.5-VL `config.json` (transformers' `Qwen2_5_VLVisionConfig`
/// defaults where a key is absent).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct VisionConfig {
    #[serde(default = "defaults::depth")]
    pub depth: i64,
    #[serde(default = "defaults::hidden_size")]
    pub hidden_size: i64,
    #[serde(default = "defaults::num_heads")]
    pub num_heads: i64,
    #[serde(default = "defaults::intermediate_size")]
    pub intermediate_size: i64,
    /// The language model's hidden size (the merger's output).
    #[serde(default = "defaults::out_hidden_size")]
    pub out_hidden_size: i64,
    #[serde(default = "defaults::patch_size")]
    pub patch_size: i64,
    #[serde(default = "defaults::temporal_patch_size")]
    pub temporal_patch_size: i64,
    #[serde(default = "defaults::in_channels", alias = "in_chans")]
    pub in_channels: i64,
    #[serde(default = "defaults::spatial_merge_size")]
    pub spatial_merge_size: i64,
    /// Attention windows' side, in pixels.
    #[serde(default = "defaults::window_size")]
    pub window_size: i64,
    /// Blocks that attend over each image whole.
    #[serde(default = "defaults::fullatt_block_indexes")]
    pub fullatt_block_indexes: Vec<i64>,
    #[serde(default = "defaults::hidden_act")]
    pub hidden_act: String,
}

mod defaults {
    pub fn depth() -> i64 {
        32
    }
    pub fn hidden_size() -> i64 {
        1280
    }
    pub fn num_heads() -> i64 {
        16
    }
    pub fn intermediate_size() -> i64 {
        3420
    }
    pub fn out_hidden_size() -> i64 {
        3584
    }
    pub fn patch_size() -> i64 {
        14
    }
    pub fn temporal_patch_size() -> i64 {
        2
    }
    pub fn in_channels() -> i64 {
        3
    }
    pub fn spatial_merge_size() -> i64 {
        2
    }
    pub fn window_size() -> i64 {
        112
    }
    pub fn fullatt_block_indexes() -> Vec<i64> {
        vec![7, 15, 23, 31]
    }
    pub fn hidden_act() -> String {
        "silu".into()
    }
}

/// Why a vision input cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    #[error(
        "an image grid of {t} x {h} x {w} patches does not split into {merge} x {merge} merge blocks"
    )]
    Grid { t: i64, h: i64, w: i64, merge: i64 },
    #[error(
        "pixel_values hold {rows} patches of width {width}; the grids need {want} patches of width {patch}"
    )]
    Shape {
        rows: i64,
        width: i64,
        want: i64,
        patch: i64,
    },
    #[error("the vision tower's activation `{0}` is not implemented (silu, gelu)")]
    Activation(String),
    #[error("{0}")]
    Text(String),
    #[error(
        "the rows hold {placeholders} image placeholder token(s) for {embeddings} image embedding(s)"
    )]
    Placeholders { placeholders: i64, embeddings: i64 },
    #[error(transparent)]
    Positions(#[from] super::mrope::MropeError),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

impl VisionConfig {
    fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_heads
    }

    /// Values per patch row of `pixel_values`.
    pub fn patch_width(&self) -> i64 {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    fn merge_unit(&self) -> i64 {
        self.spatial_merge_size * self.spatial_merge_size
    }
}

#[derive(Debug)]
struct VisionBlock {
    norm1: RmsNorm,
    norm2: RmsNorm,
    qkv: Linear,
    proj: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// The tower (module docs).
#[derive(Debug)]
pub struct VisionTower {
    cfg: VisionConfig,
    /// The patch embedding's convolution kernel, (hidden, channels, t, p, p).
    patch_embed: Tensor,
    blocks: Vec<VisionBlock>,
    merger_norm: RmsNorm,
    merger_in: Linear,
    merger_out: Linear,
}

/// Where each token sits: its rotary angles and the window order.
struct Layout {
    /// (tokens, head_dim / 2) rotary angles, in window order.
    angles: Tensor,
    /// Merge-unit indices in window order.
    window_index: Vec<i64>,
    /// Token offsets of the attention windows (window order).
    windows: Vec<i64>,
    /// Token offsets of the frames (full attention is per frame).
    images: Vec<i64>,
}

impl VisionTower {
    /// The tower's parameters under `p` (zero; loaded from a checkpoint by name).
    pub fn new(p: &Path, cfg: &VisionConfig) -> Result<Self, VisionError> {
        Self::with_adapters(p, cfg, None)
    }

    /// [`VisionTower::new`] with LoRA adapters on the linear layers `adapters` target (named
    /// `visual.blocks.0.attn.qkv`, ..., `visual.merger.mlp.2`: `p` must be `visual`).
    pub(crate) fn with_adapters(
        p: &Path,
        cfg: &VisionConfig,
        adapters: Option<Adapters<'_>>,
    ) -> Result<Self, VisionError> {
        if !matches!(cfg.hidden_act.as_str(), "silu" | "gelu") {
            return Err(VisionError::Activation(cfg.hidden_act.clone()));
        }
        let h = cfg.hidden_size;
        let pe = p / "patch_embed" / "proj";
        let patch_embed = pe.var(
            "weight",
            &[
                h,
                cfg.in_channels,
                cfg.temporal_patch_size,
                cfg.patch_size,
                cfg.patch_size,
            ],
            Init::Const(0.0),
        );
        let linear = |module: &str, dims| attention::tower_linear(p, module, dims, adapters);
        let inter = cfg.intermediate_size;
        let blocks = (0..cfg.depth)
            .map(|i| {
                let b = p / "blocks" / i;
                Ok(VisionBlock {
                    norm1: RmsNorm::new(&b / "norm1", h, 1e-6),
                    norm2: RmsNorm::new(&b / "norm2", h, 1e-6),
                    qkv: linear(&format!("blocks.{i}.attn.qkv"), (h, 3 * h))?,
                    proj: linear(&format!("blocks.{i}.attn.proj"), (h, h))?,
                    gate: linear(&format!("blocks.{i}.mlp.gate_proj"), (h, inter))?,
                    up: linear(&format!("blocks.{i}.mlp.up_proj"), (h, inter))?,
                    down: linear(&format!("blocks.{i}.mlp.down_proj"), (inter, h))?,
                })
            })
            .collect::<Result<_, VisionError>>()?;
        let merged = h * cfg.merge_unit();
        let m = p / "merger";
        Ok(VisionTower {
            cfg: cfg.clone(),
            patch_embed,
            blocks,
            merger_norm: RmsNorm::new(&m / "ln_q", h, 1e-6),
            merger_in: linear("merger.mlp.0", (merged, merged))?,
            merger_out: linear("merger.mlp.2", (merged, cfg.out_hidden_size))?,
        })
    }

    /// Embeddings of merged patches, `(Σ t·h·w / merge², out_hidden_size)`, for `pixel_values`
    /// `(Σ t·h·w, patch_width)` of images whose patch grids are `grid_thw` (in order).
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[i64; 3]],
    ) -> Result<Tensor, VisionError> {
        let c = &self.cfg;
        let x = attention::patch_embedding(pixel_values, grid_thw, &self.patch_embed, None)?;
        let want = x.size()[0];
        let layout = self.layout(grid_thw)?;
        // Into window order, merge unit by merge unit.
        let unit = c.merge_unit();
        let order = Tensor::from_slice(&layout.window_index);
        let mut x = x
            .f_reshape([want / unit, unit, c.hidden_size])?
            .f_index_select(0, &order)?
            .f_reshape([want, c.hidden_size])?;
        let emb = Tensor::f_cat(&[&layout.angles, &layout.angles], -1)?;
        let (cos, sin) = (emb.f_cos()?, emb.f_sin()?);
        for (i, block) in self.blocks.iter().enumerate() {
            let spans = if c.fullatt_block_indexes.contains(&(i as i64)) {
                &layout.images
            } else {
                &layout.windows
            };
            x = self.block(block, &x, (&cos, &sin), spans)?;
        }
        let merged = self
            .merger_norm
            .forward(&x)
            .f_reshape([want / unit, c.hidden_size * unit])?;
        let y = self
            .merger_out
            .forward(&self.merger_in.forward(&merged).f_gelu("none")?);
        // Back from window order.
        let reverse = order.f_argsort(0, false)?;
        Ok(y.f_index_select(0, &reverse)?)
    }

    fn block(
        &self,
        b: &VisionBlock,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        spans: &[i64],
    ) -> Result<Tensor, VisionError> {
        let c = &self.cfg;
        let (n, heads, d) = (x.size()[0], c.num_heads, c.head_dim());
        let qkv = b
            .qkv
            .forward(&b.norm1.forward(x))
            .f_reshape([n, 3, heads, d])?;
        let q = attention::rotate(&qkv.f_select(1, 0)?, cos, sin)?;
        let k = attention::rotate(&qkv.f_select(1, 1)?, cos, sin)?;
        let v = qkv.f_select(1, 2)?;
        let attn = attention::within_spans(&q, &k, &v, spans)?;
        let attn = attn.f_reshape([n, c.hidden_size])?;
        let x = x + b.proj.forward(&attn);
        let h = b.norm2.forward(&x);
        let gate = b.gate.forward(&h);
        let act = match c.hidden_act.as_str() {
            "gelu" => gate.f_gelu("none")?,
            _ => gate.f_silu()?,
        };
        Ok(&x + b.down.forward(&(act * b.up.forward(&h))))
    }

    /// Rotary angles and window spans of the patches of `grid_thw` (module docs).
    fn layout(&self, grid_thw: &[[i64; 3]]) -> Result<Layout, VisionError> {
        let c = &self.cfg;
        let m = c.spatial_merge_size;
        let unit = c.merge_unit();
        let merged_window = (c.window_size / m / c.patch_size).max(1);
        let half = c.head_dim() / 2;
        let (mut window_index, mut windows, mut images) = (Vec::new(), vec![0i64], vec![0i64]);
        let mut offset = 0i64;
        for &[t, h, w] in grid_thw {
            if h % m != 0 || w % m != 0 || t <= 0 {
                return Err(VisionError::Grid { t, h, w, merge: m });
            }
            // Full attention is per frame (transformers' `cu_seqlens`); a frame's tokens stay
            // contiguous in window order.
            for _ in 0..t {
                let last = images.last().copied().unwrap_or(0);
                images.push(last + h * w);
            }
            // Windows over the merged grid of each frame, left to right, top to bottom.
            let (gh, gw) = (h / m, w / m);
            let (nh, nw) = (
                (gh + merged_window - 1) / merged_window,
                (gw + merged_window - 1) / merged_window,
            );
            for f in 0..t {
                for wh in 0..nh {
                    for ww in 0..nw {
                        let mut count = 0;
                        for r in wh * merged_window..((wh + 1) * merged_window).min(gh) {
                            for col in ww * merged_window..((ww + 1) * merged_window).min(gw) {
                                window_index.push(offset + f * gh * gw + r * gw + col);
                                count += 1;
                            }
                        }
                        let last = windows.last().copied().unwrap_or(0);
                        if count > 0 {
                            windows.push(last + count * unit);
                        }
                    }
                }
            }
            offset += t * gh * gw;
        }
        // Patch positions in merge-block order, repeated for each frame.
        let angles = attention::patch_angles(grid_thw, m, c.head_dim())?;
        // Into window order.
        let order = Tensor::from_slice(&window_index);
        let total = angles.size()[0];
        let angles = angles
            .f_reshape([total / unit, unit, half])?
            .f_index_select(0, &order)?
            .f_reshape([total, half])?;
        Ok(Layout {
            angles,
            window_index,
            windows,
            images,
        })
    }
}
