//! Qwen3-VL's vision tower (transformers' `Qwen3VLVisionModel`): image patches in, one
//! embedding per merged patch out, plus the DeepStack features the language model adds to its
//! first layers' outputs at the image placeholders.
//!
//! - Patches: as Qwen2.5-VL's (one `temporal_patch_size × patch_size²` patch of every channel
//!   per row); the patch embedding is a biased convolution with the patch as kernel, so a
//!   biased linear map of the row.
//! - Absolute positions: a learned `num_position_embeddings` grid (a square of side `S`)
//!   interpolated bilinearly to each image's patch grid (transformers' `fast_pos_embed_interpolate`:
//!   `linspace(0, S - 1, h)` rows and columns, floor and floor + 1 clipped to the grid, weights
//!   from the fractional parts, summed corner by corner), in merge-block order, repeated per
//!   frame; added to the patch embeddings.
//! - Rotary positions: 2-D, as Qwen2.5-VL's; attention is bidirectional over each frame whole
//!   (no windows).
//! - Blocks: pre-norm LayerNorm (eps 1e-6, with bias), fused biased qkv, a biased two-layer MLP
//!   (`linear_fc1`, `hidden_act` (GELU with tanh), `linear_fc2`).
//! - Merger: LayerNorm over each patch, `spatial_merge_size²` patches concatenated, Linear,
//!   GELU, Linear to the language model's width. DeepStack: after each block of
//!   `deepstack_visual_indexes`, a merger of its own whose LayerNorm acts on the concatenated
//!   patches gives that level's features.
//!
//! Weights under the tower's root (`visual.`): `patch_embed.proj.{weight,bias}`,
//! `pos_embed.weight`, `blocks.{i}.{norm1,norm2}.{weight,bias}`, `blocks.{i}.attn.{qkv,proj}`,
//! `blocks.{i}.mlp.linear_fc{1,2}`, `merger.norm`, `merger.linear_fc{1,2}`,
//! `deepstack_merger_list.{k}.{norm,linear_fc1,linear_fc2}`.

use serde::Deserialize;
use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

use super::attention;
use super::qwen2_5_vl::VisionError;
use crate::model::layers::{Adapters, Linear};

/// `vision_config` of a Qwen3-VL `config.json` (transformers' `Qwen3VLVisionConfig` defaults
/// where a key is absent).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Qwen3VisionConfig {
    #[serde(default = "defaults::depth")]
    pub depth: i64,
    #[serde(default = "defaults::hidden_size")]
    pub hidden_size: i64,
    #[serde(default = "defaults::num_heads")]
    pub num_heads: i64,
    #[serde(default = "defaults::intermediate_size")]
    pub intermediate_size: i64,
    #[serde(default = "defaults::out_hidden_size")]
    pub out_hidden_size: i64,
    #[serde(default = "defaults::patch_size")]
    pub patch_size: i64,
    #[serde(default = "defaults::temporal_patch_size")]
    pub temporal_patch_size: i64,
    #[serde(default = "defaults::in_channels")]
    pub in_channels: i64,
    #[serde(default = "defaults::spatial_merge_size")]
    pub spatial_merge_size: i64,
    #[serde(default = "defaults::hidden_act")]
    pub hidden_act: String,
    #[serde(default = "defaults::num_position_embeddings")]
    pub num_position_embeddings: i64,
    #[serde(default = "defaults::deepstack_visual_indexes")]
    pub deepstack_visual_indexes: Vec<i64>,
}

mod defaults {
    pub fn depth() -> i64 {
        27
    }
    pub fn hidden_size() -> i64 {
        1152
    }
    pub fn num_heads() -> i64 {
        16
    }
    pub fn intermediate_size() -> i64 {
        4304
    }
    pub fn out_hidden_size() -> i64 {
        3584
    }
    pub fn patch_size() -> i64 {
        16
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
    pub fn hidden_act() -> String {
        "gelu_pytorch_tanh".into()
    }
    pub fn num_position_embeddings() -> i64 {
        2304
    }
    pub fn deepstack_visual_indexes() -> Vec<i64> {
        vec![8, 16, 24]
    }
}

impl Qwen3VisionConfig {
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

    /// The side of the learned position grid.
    fn grid_side(&self) -> i64 {
        (self.num_position_embeddings as f64).sqrt() as i64
    }
}

/// LayerNorm with weight and bias (eps 1e-6).
#[derive(Debug)]
struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    dim: i64,
}

impl LayerNorm {
    fn new(p: Path, dim: i64) -> Self {
        LayerNorm {
            weight: p.var("weight", &[dim], Init::Const(1.0)),
            bias: p.var("bias", &[dim], Init::Const(0.0)),
            dim,
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor, tch::TchError> {
        x.f_layer_norm(
            [self.dim],
            Some(&self.weight),
            Some(&self.bias),
            1e-6,
            false,
        )
    }
}

#[derive(Debug)]
struct Block {
    norm1: LayerNorm,
    norm2: LayerNorm,
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// A patch merger: the main one normalises each patch, a DeepStack one the concatenation.
#[derive(Debug)]
struct Merger {
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    postshuffle: bool,
}

/// The tower (module docs).
#[derive(Debug)]
pub struct Qwen3VisionTower {
    cfg: Qwen3VisionConfig,
    /// The patch embedding's convolution kernel `(hidden, channels, t, p, p)` and bias.
    patch_embed: (Tensor, Tensor),
    pos_embed: Tensor,
    blocks: Vec<Block>,
    merger: Merger,
    deepstack: Vec<Merger>,
}

/// The tower's output: an embedding per merged patch, and each DeepStack level's features
/// (the same rows), all `(Σ t·h·w / merge², out_hidden_size)`.
pub struct TowerOutput {
    pub embeds: Tensor,
    pub deepstack: Vec<Tensor>,
}

impl Qwen3VisionTower {
    /// The tower's parameters under `p` (`visual`), with LoRA adapters on the linear layers
    /// `adapters` target.
    pub(crate) fn new(
        p: &Path,
        cfg: &Qwen3VisionConfig,
        adapters: Option<Adapters<'_>>,
    ) -> Result<Self, VisionError> {
        if !matches!(
            cfg.hidden_act.as_str(),
            "gelu_pytorch_tanh" | "gelu" | "silu"
        ) {
            return Err(VisionError::Activation(cfg.hidden_act.clone()));
        }
        let side = cfg.grid_side();
        if side * side != cfg.num_position_embeddings || side < 1 {
            return Err(VisionError::Text(format!(
                "vision_config.num_position_embeddings ({}) is not a square",
                cfg.num_position_embeddings
            )));
        }
        let h = cfg.hidden_size;
        let linear = |module: &str, dims| attention::tower_linear(p, module, dims, adapters);
        let merged = h * cfg.merge_unit();
        let merger = |prefix: &str, postshuffle: bool| -> Result<Merger, VisionError> {
            let at = prefix.split('.').fold(p.clone(), |at, part| at.sub(part));
            Ok(Merger {
                norm: LayerNorm::new(&at / "norm", if postshuffle { merged } else { h }),
                fc1: linear(&format!("{prefix}.linear_fc1"), (merged, merged))?,
                fc2: linear(
                    &format!("{prefix}.linear_fc2"),
                    (merged, cfg.out_hidden_size),
                )?,
                postshuffle,
            })
        };
        let inter = cfg.intermediate_size;
        let blocks = (0..cfg.depth)
            .map(|i| {
                let b = p / "blocks" / i;
                Ok(Block {
                    norm1: LayerNorm::new(&b / "norm1", h),
                    norm2: LayerNorm::new(&b / "norm2", h),
                    qkv: linear(&format!("blocks.{i}.attn.qkv"), (h, 3 * h))?,
                    proj: linear(&format!("blocks.{i}.attn.proj"), (h, h))?,
                    fc1: linear(&format!("blocks.{i}.mlp.linear_fc1"), (h, inter))?,
                    fc2: linear(&format!("blocks.{i}.mlp.linear_fc2"), (inter, h))?,
                })
            })
            .collect::<Result<_, VisionError>>()?;
        let deepstack = (0..cfg.deepstack_visual_indexes.len())
            .map(|k| merger(&format!("deepstack_merger_list.{k}"), true))
            .collect::<Result<_, _>>()?;
        Ok(Qwen3VisionTower {
            cfg: cfg.clone(),
            patch_embed: {
                let pe = p / "patch_embed" / "proj";
                let kernel = [
                    h,
                    cfg.in_channels,
                    cfg.temporal_patch_size,
                    cfg.patch_size,
                    cfg.patch_size,
                ];
                (
                    pe.var("weight", &kernel, Init::Const(0.0)),
                    pe.var("bias", &[h], Init::Const(0.0)),
                )
            },
            pos_embed: (p / "pos_embed").var(
                "weight",
                &[cfg.num_position_embeddings, h],
                Init::Const(0.0),
            ),
            blocks,
            merger: merger("merger", false)?,
            deepstack,
        })
    }

    pub fn config(&self) -> &Qwen3VisionConfig {
        &self.cfg
    }

    /// The embeddings and DeepStack features of `pixel_values` `(Σ t·h·w, patch_width)` of
    /// images whose patch grids are `grid_thw` (in order).
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[i64; 3]],
    ) -> Result<TowerOutput, VisionError> {
        let c = &self.cfg;
        let m = c.spatial_merge_size;
        let mut frames = vec![0i64];
        for &[t, h, w] in grid_thw {
            if h % m != 0 || w % m != 0 || t <= 0 {
                return Err(VisionError::Grid { t, h, w, merge: m });
            }
            for _ in 0..t {
                let last = frames.last().copied().unwrap_or(0);
                frames.push(last + h * w);
            }
        }
        let (kernel, bias) = &self.patch_embed;
        let x = attention::patch_embedding(pixel_values, grid_thw, kernel, Some(bias))?
            .f_add(&self.positions(grid_thw)?)?;
        let angles = attention::patch_angles(grid_thw, m, c.head_dim())?;
        let emb = Tensor::f_cat(&[&angles, &angles], -1)?;
        let (cos, sin) = (emb.f_cos()?, emb.f_sin()?);
        let mut x = x;
        let mut deepstack = Vec::with_capacity(self.deepstack.len());
        for (i, block) in self.blocks.iter().enumerate() {
            x = self.block(block, &x, (&cos, &sin), &frames)?;
            if let Some(k) = c
                .deepstack_visual_indexes
                .iter()
                .position(|&d| d == i as i64)
            {
                deepstack.push(self.merge(&self.deepstack[k], &x)?);
            }
        }
        Ok(TowerOutput {
            embeds: self.merge(&self.merger, &x)?,
            deepstack,
        })
    }

    /// The learned position grid interpolated to each image's patch grid, in merge-block
    /// order, `(Σ t·h·w, hidden)`.
    fn positions(&self, grid_thw: &[[i64; 3]]) -> Result<Tensor, VisionError> {
        let c = &self.cfg;
        let (side, m) = (c.grid_side(), c.spatial_merge_size);
        let opts = (Kind::Float, tch::Device::Cpu);
        let device = self.pos_embed.device();
        let mut out = Vec::with_capacity(grid_thw.len());
        for &[t, h, w] in grid_thw {
            // Rows and columns of the grid each patch reads, with their fractional offsets.
            let axis = |n: i64| -> Result<(Tensor, Tensor, Tensor), tch::TchError> {
                let at = Tensor::f_linspace(0.0, (side - 1) as f64, n, opts)?;
                let floor = at.f_to_kind(Kind::Int)?;
                let ceil = (floor.f_add_scalar(1)?).f_clamp_max(side - 1)?;
                let frac = at.f_sub(&floor.f_to_kind(Kind::Float)?)?;
                Ok((
                    floor.f_to_kind(Kind::Int64)?,
                    ceil.f_to_kind(Kind::Int64)?,
                    frac,
                ))
            };
            let (hf, hc, dh) = axis(h)?;
            let (wf, wc, dw) = axis(w)?;
            let index = |rows: &Tensor, cols: &Tensor| -> Result<Tensor, tch::TchError> {
                rows.f_mul_scalar(side)?
                    .f_unsqueeze(1)?
                    .f_add(&cols.f_unsqueeze(0)?)?
                    .f_flatten(0, 1)
            };
            let weight = |a: &Tensor, b: &Tensor| -> Result<Tensor, tch::TchError> {
                a.f_unsqueeze(1)?.f_mul(&b.f_unsqueeze(0)?)?.f_flatten(0, 1)
            };
            let (one_h, one_w) = (
                dh.f_neg()?.f_add_scalar(1.0)?,
                dw.f_neg()?.f_add_scalar(1.0)?,
            );
            let corners = [
                (index(&hf, &wf)?, weight(&one_h, &one_w)?),
                (index(&hf, &wc)?, weight(&one_h, &dw)?),
                (index(&hc, &wf)?, weight(&dh, &one_w)?),
                (index(&hc, &wc)?, weight(&dh, &dw)?),
            ];
            let mut sum: Option<Tensor> = None;
            for (idx, wt) in corners {
                let e = self
                    .pos_embed
                    .f_index_select(0, &idx.f_to_device(device)?)?
                    .f_mul(
                        &wt.f_to_kind(self.pos_embed.kind())?
                            .f_to_device(device)?
                            .f_unsqueeze(1)?,
                    )?;
                sum = Some(match sum {
                    Some(s) => s.f_add(&e)?,
                    None => e,
                });
            }
            let Some(grid) = sum else { continue };
            let hidden = c.hidden_size;
            out.push(
                grid.f_repeat([t, 1])?
                    .f_view([t, h / m, m, w / m, m, hidden])?
                    .f_permute([0, 1, 3, 2, 4, 5])?
                    .f_reshape([t * h * w, hidden])?,
            );
        }
        Ok(Tensor::f_cat(&out, 0)?)
    }

    fn block(
        &self,
        b: &Block,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        frames: &[i64],
    ) -> Result<Tensor, VisionError> {
        let c = &self.cfg;
        let (n, heads, d) = (x.size()[0], c.num_heads, c.head_dim());
        let qkv = b
            .qkv
            .forward(&b.norm1.forward(x)?)
            .f_reshape([n, 3, heads, d])?;
        let q = attention::rotate(&qkv.f_select(1, 0)?, cos, sin)?;
        let k = attention::rotate(&qkv.f_select(1, 1)?, cos, sin)?;
        let v = qkv.f_select(1, 2)?;
        let attn = attention::within_spans(&q, &k, &v, frames)?.f_reshape([n, c.hidden_size])?;
        let x = x + b.proj.forward(&attn);
        let h = b.fc1.forward(&b.norm2.forward(&x)?);
        let act = match c.hidden_act.as_str() {
            "gelu_pytorch_tanh" => h.f_gelu("tanh")?,
            "gelu" => h.f_gelu("none")?,
            _ => h.f_silu()?,
        };
        Ok(&x + b.fc2.forward(&act))
    }

    fn merge(&self, merger: &Merger, x: &Tensor) -> Result<Tensor, VisionError> {
        let unit = self.cfg.merge_unit();
        let width = self.cfg.hidden_size * unit;
        let n = x.size()[0];
        let merged = if merger.postshuffle {
            merger.norm.forward(&x.f_reshape([n / unit, width])?)?
        } else {
            merger.norm.forward(x)?.f_reshape([n / unit, width])?
        };
        Ok(merger
            .fc2
            .forward(&merger.fc1.forward(&merged).f_gelu("none")?))
    }
}
