//! The building blocks every architecture shares: the linear layer (whole, or one
//! tensor-parallel rank's columns or rows, with an optional LoRA adapter), RMSNorm, and the
//! [`Regions`] a decoder layer passes through at its tensor-parallel boundaries.
//!
//! A layer is written once and run three ways by choosing its regions: [`Replicated`] (one
//! rank holds whole weights: the single and FSDP engines, the full-model rollout),
//! [`crate::parallel::tp::InferenceRegions`] (a Megatron rank's shards without autograd: its rollout) and
//! [`crate::parallel::tp::TrainingRegions`] (a Megatron rank's shards with the tape that reverses the
//! collectives, optionally sequence-parallel). Without a tensor-parallel group the three
//! compute the same thing.

use std::convert::Infallible;

use super::moe::SparseMoe;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

use super::lora::{LoraAdapter, LoraConfig};

/// How a [`Linear`]'s weight is split over the tensor-parallel group (Megatron's column- and
/// row-parallel linears; `Whole` is neither, or a group of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Whole,
    /// Output features (weight dim 0) split: the output stays split.
    Columns,
    /// Input features (weight dim 1) split: partial outputs are summed over the group, then
    /// the (replicated) bias is added.
    Rows,
}

/// `y = x W^T + b` with the weight (out, in) as in PyTorch, holding this rank's part of it
/// (see [`Split`]), plus a LoRA adapter's output when the layer has one.
#[derive(Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub lora: Option<LoraAdapter>,
    pub split: Split,
}

/// What a model's constructors need to add adapters: the configuration and the model's
/// on/off switch shared by all of them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Adapters<'a> {
    pub config: &'a LoraConfig,
    pub enabled: &'a Arc<AtomicBool>,
    /// Whether the model has a vision tower (which renames its modules for PEFT:
    /// [`super::lora::peft_module`]).
    pub vision: bool,
}

impl<'a> Adapters<'a> {
    /// The adapters `lora` asks for, switched by `enabled` (none unless both are there), in a
    /// model with a vision tower (`vision`) or without.
    pub(crate) fn of(
        lora: Option<&'a LoraConfig>,
        enabled: Option<&'a Arc<AtomicBool>>,
        vision: bool,
    ) -> Option<Self> {
        lora.zip(enabled).map(|(config, enabled)| Adapters {
            config,
            enabled,
            vision,
        })
    }
}

/// `n / parts`, or a message naming what does not divide.
pub(crate) fn divide(n: i64, parts: i64, what: &str) -> Result<i64, String> {
    if parts <= 0 || n % parts != 0 {
        return Err(format!(
            "{what} ({n}) is not divisible by the tensor-parallel size ({parts})"
        ));
    }
    Ok(n / parts)
}

impl Linear {
    /// A whole linear layer under `p`.
    pub fn new(p: Path, in_dim: i64, out_dim: i64, bias: bool) -> Self {
        Linear {
            weight: p.var("weight", &[out_dim, in_dim], Init::Const(0.0)),
            bias: bias.then(|| p.var("bias", &[out_dim], Init::Const(0.0))),
            lora: None,
            split: Split::Whole,
        }
    }

    /// This rank's part of an `in_dim -> out_dim` layer split `split` over `tp` ranks: weight
    /// (out / tp, in) and bias (out / tp) for columns, weight (out, in / tp) and a whole bias
    /// for rows. A LoRA adapter only on a whole layer (tensor-parallel LoRA is refused when
    /// the config is checked).
    pub(crate) fn split(
        p: Path,
        (in_dim, out_dim, bias): (i64, i64, bool),
        split: Split,
        tp: i64,
    ) -> Result<Self, String> {
        let what = |side: &str| format!("{side} features of {}", p.path("weight"));
        let (rows, cols, bias_len) = match split {
            Split::Whole => (out_dim, in_dim, out_dim),
            Split::Columns => {
                let local = divide(out_dim, tp, &what("output"))?;
                (local, in_dim, local)
            }
            Split::Rows => (out_dim, divide(in_dim, tp, &what("input"))?, out_dim),
        };
        let zero = Init::Const(0.0);
        let weight = p
            .f_var("weight", &[rows, cols], zero)
            .map_err(|e| e.to_string())?;
        let bias = bias
            .then(|| p.f_var("bias", &[bias_len], zero))
            .transpose()
            .map_err(|e| e.to_string())?;
        Ok(Linear {
            weight,
            bias,
            lora: None,
            split: if tp == 1 { Split::Whole } else { split },
        })
    }

    /// [`Linear::split`] named `name` (`model.layers.0.self_attn.q_proj`), with an adapter when
    /// the model has adapters that target it.
    pub(crate) fn adapted(
        p: Path,
        name: &str,
        dims: (i64, i64, bool),
        (split, tp): (Split, i64),
        adapters: Option<Adapters<'_>>,
    ) -> Result<Self, String> {
        let (in_dim, out_dim, _) = dims;
        let lora = adapters
            .filter(|a| a.config.targets(&super::lora::peft_module(name, a.vision)))
            .map(|a| LoraAdapter::new(&p, in_dim, out_dim, a.config, a.enabled.clone()));
        if lora.is_some() && tp > 1 {
            return Err(format!(
                "LoRA on the tensor-parallel layer {name} is not implemented"
            ));
        }
        Ok(Linear {
            lora,
            ..Linear::split(p, dims, split, tp)?
        })
    }

    /// The layer on `x`: whole, or this rank's local output of a column-split layer (a
    /// row-split layer's sum over the group is its regions' [`Regions::exit`]).
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.linear(&self.weight, self.bias.as_ref());
        match self.lora.as_ref().and_then(|l| l.delta(x)) {
            Some(d) => y + d,
            None => y,
        }
    }

    /// This rank's partial product (before the reduction and the bias).
    pub fn partial(&self, x: &Tensor) -> Tensor {
        x.linear::<&Tensor>(&self.weight, None)
    }

    /// `y` plus the bias, if any.
    pub fn add_bias(&self, y: Tensor) -> Tensor {
        match &self.bias {
            Some(b) => y + b,
            None => y,
        }
    }
}

/// Root-mean-square norm, computed in f32 and cast back before the weight (as transformers'
/// Llama/Qwen norm); zero-centred (Qwen3.5's), it scales by `1 + weight` in f32 and casts
/// after.
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    eps: f64,
    zero_centered: bool,
}

impl RmsNorm {
    pub fn new(p: Path, dim: i64, eps: f64) -> Self {
        RmsNorm {
            weight: p.var("weight", &[dim], Init::Const(1.0)),
            eps,
            zero_centered: false,
        }
    }

    /// The norm a model of `cfg` uses for its layers, q/k and final norm.
    pub fn of(cfg: &super::ModelConfig, p: Path, dim: i64) -> Self {
        let zero_centered = cfg.zero_centered_norm();
        let identity = if zero_centered { 0.0 } else { 1.0 };
        RmsNorm {
            weight: p.var("weight", &[dim], Init::Const(identity)),
            eps: cfg.rms_norm_eps,
            zero_centered,
        }
    }

    /// The epsilon added to the mean square.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let xf = x.to_kind(Kind::Float);
        let var = xf.square().mean_dim(-1, true, Kind::Float);
        let normed = xf * (var + self.eps).rsqrt();
        if self.zero_centered {
            return (normed * (self.weight.to_kind(Kind::Float) + 1.0)).to_kind(kind);
        }
        &self.weight * normed.to_kind(kind)
    }
}

/// Embeddings `x` times `scale` (a family's `sqrt(hidden_size)`) rounded to their dtype first,
/// as transformers multiplies by a scalar tensor of the hidden states' dtype.
pub fn scale_embeddings(x: Tensor, scale: Option<f64>) -> Tensor {
    match scale {
        Some(s) => {
            let s = Tensor::from(s).to_kind(x.kind()).to_device(x.device());
            x * s
        }
        None => x,
    }
}

/// The slope inside the clamped SwiGLU (fixed in transformers' modelling code).
const CLAMPED_GLU_ALPHA: f64 = 1.702;

/// The activation of a gated MLP's gate (`hidden_act`, as transformers' `ACT2FN` names it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    Silu,
    /// GELU by the error function (`gelu`).
    Gelu,
    /// GELU's tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
    /// Biased experts (`ExpertStyle::FusedInterleavedBiased`): `(clamp(up, ±limit) + 1) · g · sigmoid(1.702 g)` with
    /// `g = min(gate, limit)` (see [`Activation::glu`]).
    ClampedSwiglu {
        limit: f64,
    },
}

impl Activation {
    /// The activation `hidden_act` names, if verlc implements it.
    pub fn of(hidden_act: &str) -> Option<Self> {
        match hidden_act {
            "silu" | "swish" => Some(Activation::Silu),
            "gelu" => Some(Activation::Gelu),
            "gelu_pytorch_tanh" => Some(Activation::GeluTanh),
            _ => None,
        }
    }

    /// The activation of a gate alone (the clamped SwiGLU's is its `g · sigmoid(1.702 g)`).
    pub fn forward(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Silu => x.silu(),
            Activation::Gelu => x.gelu("none"),
            Activation::GeluTanh => x.gelu("tanh"),
            Activation::ClampedSwiglu { limit } => {
                let g = x.clamp_max(limit);
                &g * (&g * CLAMPED_GLU_ALPHA).sigmoid()
            }
        }
    }

    /// A gated MLP's product of its gate and up projections' outputs.
    pub fn glu(self, gate: &Tensor, up: &Tensor) -> Tensor {
        match self {
            Activation::ClampedSwiglu { limit } => {
                (up.clamp(-limit, limit) + 1.0) * self.forward(gate)
            }
            _ => self.forward(gate) * up,
        }
    }
}

/// The tensor-parallel boundaries of a decoder layer, in Megatron's terms: the residual
/// stream between segments, `f` into column-split layers, `g` out of row-split ones. A layer
/// calls these in order (cut, enter, ..., exit, cut, enter, ..., exit); see the module docs
/// for the three implementations.
pub trait Regions {
    type Error;
    /// The residual stream at a segment boundary (a tape records it there for the backward).
    fn cut(&mut self, x: &Tensor) -> Tensor {
        x.shallow_clone()
    }
    /// Into column-split layers: `x` replicated over the group (or the sequence gathered).
    fn enter(&mut self, x: Tensor) -> Result<Tensor, Self::Error>;
    /// Out of the row-split layer `row` applied to `x`: its whole output (or this rank's chunk
    /// of the sequence), bias included.
    fn exit(&mut self, row: &Linear, x: &Tensor) -> Result<Tensor, Self::Error>;
    /// Out of row-split layers whose partial outputs the caller has combined already (a
    /// mixture-of-experts block's weighted experts): the sum over the group, without bias.
    fn reduce(&mut self, partial: Tensor) -> Result<Tensor, Self::Error>;
    /// An attention layer's keys and values `(B, kv_heads, T, D)` of this rank's positions,
    /// extended to every key its queries attend to: under context parallelism the positions
    /// of all ranks of the group (gathered, their gradient reduce-scattered back); else
    /// unchanged.
    fn keys_values(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor), Self::Error> {
        Ok((k, v))
    }
    /// A recurrent (Gated DeltaNet) layer's input `x` (B, T, hidden) and real-token mask
    /// `valid` (B, T) over whole sequences: under context parallelism every rank's positions
    /// gathered into sequence order (the gradient of `x` reduced back to the ranks); else
    /// unchanged. [`Regions::own_positions`] takes the layer's output back to this rank's.
    fn whole_sequences(
        &mut self,
        x: Tensor,
        valid: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>), Self::Error> {
        Ok((x, valid.map(Tensor::shallow_clone)))
    }
    /// This rank's positions of `y` (B, T, ·), computed over [`Regions::whole_sequences`].
    fn own_positions(&mut self, y: Tensor) -> Result<Tensor, Self::Error> {
        Ok(y)
    }
    /// A mixture-of-experts block on `x`: its whole output (experts split over tensor
    /// parallelism reduced like a row layer; experts split over an expert-parallel group
    /// exchanged with it).
    /// `valid` marks the real tokens of `x` (without its hidden dim; `None`: all), which
    /// the router's losses count.
    fn experts(
        &mut self,
        moe: &SparseMoe,
        x: &Tensor,
        valid: Option<&Tensor>,
    ) -> Result<Tensor, Self::Error>;
}

/// Whole weights on one rank: every boundary is the identity and a row layer is a plain
/// linear (with its adapter).
#[derive(Debug, Clone, Copy, Default)]
pub struct Replicated;

impl Regions for Replicated {
    type Error = Infallible;

    fn enter(&mut self, x: Tensor) -> Result<Tensor, Infallible> {
        Ok(x)
    }

    fn exit(&mut self, row: &Linear, x: &Tensor) -> Result<Tensor, Infallible> {
        Ok(row.forward(x))
    }

    fn reduce(&mut self, partial: Tensor) -> Result<Tensor, Infallible> {
        Ok(partial)
    }

    fn experts(
        &mut self,
        moe: &SparseMoe,
        x: &Tensor,
        _valid: Option<&Tensor>,
    ) -> Result<Tensor, Infallible> {
        Ok(moe.forward(x))
    }
}

/// The value of a computation that cannot fail.
pub(crate) fn infallible<T>(r: Result<T, Infallible>) -> T {
    match r {
        Ok(t) => t,
        Err(never) => match never {},
    }
}
