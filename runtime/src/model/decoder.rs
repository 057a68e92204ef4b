//! The decoder of the Llama / Qwen2 / Qwen3 family, one struct per block in the order of
//! Hugging Face's `modeling_qwen2.py`: MLP, attention, decoder layer, model. The same code
//! serves every engine: the single and FSDP engines and the full-model rollout hold whole
//! weights; a Megatron rank builds the same layers over its tensor-parallel size (q/k/v and
//! gate/up split by columns, o and down by rows, local head counts) for its pipeline stage's
//! layer range ([`crate::engine::megatron::ParallelModel`]) and runs them through other
//! [`Regions`]. Incremental decoding is [`DecoderLayer::forward_in`] with a [`KvCache`] on
//! either.
//!
//! Constructors register zero-initialised variables under the checkpoint's names
//! (`model.layers.{i}.self_attn.q_proj.weight` …) and never open files; weights come from
//! [`super::load`] or [`super::init`]. Differences between the architectures are data of
//! [`ModelConfig`]: `qkv_bias` (Qwen2, or `attention_bias`), `o_bias`, `qk_norm` (Qwen3,
//! Qwen3-MoE, Qwen3.5), for Qwen3-MoE which layers have a sparse MLP ([`super::moe`]), and for
//! Qwen3.5 which layers mix tokens with a Gated DeltaNet ([`super::gated_deltanet`]) instead
//! of attention, the attention's output gate, partial rotary and zero-centred norms.

use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::ModelConfig;
use super::cache::{KvCache, causal_padding_mask, causal_window_mask};
use super::eager_attention::{self, AttentionVariant};
use super::gated_deltanet::GatedDeltaNet;
use super::layers::{
    Activation, Adapters, Regions, Replicated, Split, divide, infallible, scale_embeddings,
};
pub use super::layers::{Linear, RmsNorm};
use super::moe::SparseMoe;
use super::packed::{AttentionSpan, PackedWindow, Packing, attend_spans};
use super::rope::{RotaryEmbedding, apply_rotary};
use super::vision::InputEmbeds;

/// Names and whole (unsplit) shapes of the backbone's variables in model order (Hugging Face
/// registration order): the embedding when `embedding`, layers `layers`, the final norm when
/// `final_norm`. What a pipeline stage lists for export and sorts its variables by; a test
/// holds it equal to what the constructors register.
pub fn param_shapes(
    cfg: &ModelConfig,
    layers: std::ops::Range<usize>,
    embedding: bool,
    final_norm: bool,
) -> Vec<(String, Vec<i64>)> {
    let (h, i, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim());
    let (q, kv) = (cfg.num_attention_heads * hd, cfg.kv_heads() * hd);
    let mut out: Vec<(String, Vec<i64>)> = Vec::new();
    if embedding {
        out.push(("model.embed_tokens.weight".into(), vec![cfg.vocab_size, h]));
    }
    type Shapes = Vec<(String, Vec<i64>)>;
    let norm = |out: &mut Shapes, name: String, dim: i64| out.push((name + ".weight", vec![dim]));
    let linear = |out: &mut Shapes, name: String, (in_dim, out_dim): (i64, i64), bias: bool| {
        out.push((format!("{name}.weight"), vec![out_dim, in_dim]));
        if bias {
            out.push((name + ".bias", vec![out_dim]));
        }
    };
    let m = &cfg.moe;
    for l in layers {
        let n = |part: &str| format!("model.layers.{l}.{part}");
        norm(&mut out, n("input_layernorm"), h);
        if cfg.linear_layer(l) {
            let la = &cfg.linear;
            let nv = la.linear_num_value_heads;
            linear(
                &mut out,
                n("linear_attn.in_proj_qkv"),
                (h, la.conv_dim()),
                false,
            );
            linear(
                &mut out,
                n("linear_attn.in_proj_z"),
                (h, la.value_dim()),
                false,
            );
            linear(&mut out, n("linear_attn.in_proj_b"), (h, nv), false);
            linear(&mut out, n("linear_attn.in_proj_a"), (h, nv), false);
            let conv = vec![la.conv_dim(), 1, la.linear_conv_kernel_dim];
            out.push((n("linear_attn.conv1d.weight"), conv));
            out.push((n("linear_attn.dt_bias"), vec![nv]));
            out.push((n("linear_attn.A_log"), vec![nv]));
            norm(&mut out, n("linear_attn.norm"), la.linear_value_head_dim);
            linear(
                &mut out,
                n("linear_attn.out_proj"),
                (la.value_dim(), h),
                false,
            );
        } else {
            let gate = if cfg.attn_output_gate() { 2 } else { 1 };
            linear(
                &mut out,
                n("self_attn.q_proj"),
                (h, gate * q),
                cfg.qkv_bias(),
            );
            linear(&mut out, n("self_attn.k_proj"), (h, kv), cfg.qkv_bias());
            linear(&mut out, n("self_attn.v_proj"), (h, kv), cfg.qkv_bias());
            linear(&mut out, n("self_attn.o_proj"), (q, h), cfg.o_bias());
            if cfg.qk_norm() {
                norm(&mut out, n("self_attn.q_norm"), hd);
                norm(&mut out, n("self_attn.k_norm"), hd);
            }
            if cfg.attention_sinks() {
                out.push((n("self_attn.sinks"), vec![cfg.num_attention_heads]));
            }
        }
        norm(&mut out, n("post_attention_layernorm"), h);
        if cfg.sandwich_norms() {
            norm(&mut out, n("pre_feedforward_layernorm"), h);
            norm(&mut out, n("post_feedforward_layernorm"), h);
        }
        if cfg.sparse_layer(l) {
            let biased = cfg.expert_style().biased();
            let router = SparseMoe::router_name(cfg);
            linear(
                &mut out,
                n(&format!("mlp.{router}")),
                (h, m.num_experts),
                biased,
            );
            let mi = m.moe_intermediate_size;
            for e in 0..m.num_experts {
                linear(
                    &mut out,
                    n(&format!("mlp.experts.{e}.gate_proj")),
                    (h, mi),
                    biased,
                );
                linear(
                    &mut out,
                    n(&format!("mlp.experts.{e}.up_proj")),
                    (h, mi),
                    biased,
                );
                linear(
                    &mut out,
                    n(&format!("mlp.experts.{e}.down_proj")),
                    (mi, h),
                    biased,
                );
            }
            let si = m.shared_expert_intermediate_size;
            if si > 0 {
                linear(&mut out, n("mlp.shared_expert.gate_proj"), (h, si), false);
                linear(&mut out, n("mlp.shared_expert.up_proj"), (h, si), false);
                linear(&mut out, n("mlp.shared_expert.down_proj"), (si, h), false);
                linear(&mut out, n("mlp.shared_expert_gate"), (h, 1), false);
            }
        } else {
            linear(&mut out, n("mlp.gate_proj"), (h, i), cfg.mlp_bias);
            linear(&mut out, n("mlp.up_proj"), (h, i), cfg.mlp_bias);
            linear(&mut out, n("mlp.down_proj"), (i, h), cfg.mlp_bias);
        }
    }
    if final_norm {
        out.push(("model.norm.weight".into(), vec![h]));
    }
    out
}

/// Where a layer is built: its global index (for names), its slot in the KV cache of the
/// model that holds it, and the tensor-parallel size its weights are split over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerPlace<'a> {
    pub index: usize,
    pub slot: usize,
    pub tp: i64,
    pub adapters: Option<Adapters<'a>>,
    /// The expert-parallel group that splits a mixture-of-experts layer's experts (`None`:
    /// this rank holds them all).
    pub experts: Option<&'a super::rank_group::SharedRankGroup>,
    /// The tensor-parallel size the routed experts' MLPs are split over: `tp` (Megatron's
    /// default expert tensor parallelism) or 1 (whole experts).
    pub expert_tp: i64,
}

impl LayerPlace<'_> {
    pub(crate) fn linear(
        &self,
        p: Path,
        name: &str,
        dims: (i64, i64, bool),
        split: Split,
    ) -> Result<Linear, String> {
        let name = format!("model.layers.{}.{name}", self.index);
        Linear::adapted(p, &name, dims, (split, self.tp), self.adapters)
    }
}

/// Gated feed-forward: `down(act(gate(x)) * up(x))`, SwiGLU unless the config's
/// `hidden_act` names another activation (a GELU).
#[derive(Debug)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    act: Activation,
}

impl Mlp {
    /// The MLP named `prefix` in its layer (`mlp`, or `mlp.experts.3`) of `hidden ->
    /// intermediate -> hidden`, with biases when `bias`.
    pub(crate) fn build(
        p: Path,
        at: LayerPlace<'_>,
        prefix: &str,
        (h, i, b): (i64, i64, bool),
    ) -> Result<Self, String> {
        let name = |n: &str| format!("{prefix}.{n}");
        Ok(Mlp {
            gate_proj: at.linear(
                &p / "gate_proj",
                &name("gate_proj"),
                (h, i, b),
                Split::Columns,
            )?,
            up_proj: at.linear(&p / "up_proj", &name("up_proj"), (h, i, b), Split::Columns)?,
            down_proj: at.linear(&p / "down_proj", &name("down_proj"), (i, h, b), Split::Rows)?,
            act: Activation::Silu,
        })
    }

    /// The input of `down_proj` (this rank's part of the intermediate size).
    pub(crate) fn core(&self, x: &Tensor) -> Tensor {
        self.act
            .glu(&self.gate_proj.forward(x), &self.up_proj.forward(x))
    }

    /// The MLP with `act` for its gate.
    pub(crate) fn with_activation(mut self, act: Activation) -> Self {
        self.act = act;
        self
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.down_proj.forward(&self.core(x))
    }

    /// This rank's partial output (row-split `down_proj` before the sum over the group).
    pub(crate) fn partial(&self, x: &Tensor) -> Tensor {
        self.down_proj.partial(&self.core(x))
    }

    /// Whether `down_proj` is split by rows (tensor parallelism).
    pub(crate) fn is_split(&self) -> bool {
        self.down_proj.split == Split::Rows
    }
}

/// A layer's MLP: dense SwiGLU, or Qwen3-MoE's sparse experts (see
/// [`ModelConfig::sparse_layer`]).
#[derive(Debug)]
pub enum FeedForward {
    Dense(Mlp),
    Sparse(SparseMoe),
}

impl FeedForward {
    fn build(cfg: &ModelConfig, p: Path, at: LayerPlace<'_>) -> Result<Self, String> {
        if cfg.sparse_layer(at.index) {
            let moe = match at.experts.filter(|g| g.size() > 1) {
                Some(ep) => {
                    let (size, rank) = (ep.size() as i64, ep.rank() as i64);
                    let e = cfg.moe.num_experts;
                    if e % size != 0 {
                        return Err(format!(
                            "expert parallel size {size} does not divide the {e} experts"
                        ));
                    }
                    let local = e / size;
                    let mut moe =
                        SparseMoe::build_range(cfg, p, at, rank * local..(rank + 1) * local)?;
                    moe.set_expert_group(ep.clone())?;
                    moe
                }
                None => SparseMoe::build(cfg, p, at)?,
            };
            return Ok(FeedForward::Sparse(moe));
        }
        let dims = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        let mut mlp = Mlp::build(p, at, "mlp", dims)?;
        // Experts are SwiGLU (the config check refuses another activation with experts).
        mlp.act = Activation::of(&cfg.hidden_act)
            .ok_or_else(|| format!("hidden_act `{}` is not supported", cfg.hidden_act))?;
        Ok(FeedForward::Dense(mlp))
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        match self {
            FeedForward::Dense(mlp) => mlp.forward(x),
            FeedForward::Sparse(moe) => moe.forward(x),
        }
    }
}

/// Grouped-query self-attention with RoPE, optional q/k norm and an optional KV cache.
#[derive(Debug)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// This rank's query and key/value heads (all of them without tensor parallelism).
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    /// Qwen3.5's output gate: `q_proj` yields each head's query and a gate side by side, and
    /// the heads' output is scaled by `sigmoid(gate)` before `o_proj`.
    output_gate: bool,
    /// A learned sink logit per head (`self_attn.sinks`), in each softmax's denominator.
    sinks: Option<Tensor>,
    /// The sliding window of this layer, if it has one ([`ModelConfig::attention_window`]).
    window: Option<i64>,
    /// The cap of its attention scores ([`ModelConfig::attention_softcap`]).
    softcap: Option<f64>,
    /// What the queries are multiplied by for the family's attention scale
    /// ([`ModelConfig::query_scale`]).
    query_scale: Option<f64>,
    /// This layer's slot in a [`KvCache`] of the model that holds it.
    slot: usize,
}

impl Attention {
    fn build(cfg: &ModelConfig, p: Path, at: LayerPlace<'_>) -> Result<Self, String> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (q, kv) = (cfg.num_attention_heads * hd, cfg.kv_heads() * hd);
        let norm = |name: &str| cfg.qk_norm().then(|| RmsNorm::of(cfg, &p / name, hd));
        let (qkv_bias, cols) = (cfg.qkv_bias(), Split::Columns);
        // With Qwen3.5's output gate, `q_proj` holds each head's query and gate side by side:
        // split by rows over tensor parallelism, a rank gets whole heads with their gates.
        let output_gate = cfg.attn_output_gate();
        let q_out = if output_gate { 2 * q } else { q };
        // A rank's sinks are its heads' (split like the heads under tensor parallelism).
        let sinks = if cfg.attention_sinks() {
            let local = divide(cfg.num_attention_heads, at.tp, "num_attention_heads")?;
            Some(p.var("sinks", &[local], Init::Const(0.0)))
        } else {
            None
        };
        Ok(Attention {
            q_proj: at.linear(
                &p / "q_proj",
                "self_attn.q_proj",
                (h, q_out, qkv_bias),
                cols,
            )?,
            k_proj: at.linear(&p / "k_proj", "self_attn.k_proj", (h, kv, qkv_bias), cols)?,
            v_proj: at.linear(&p / "v_proj", "self_attn.v_proj", (h, kv, qkv_bias), cols)?,
            o_proj: at.linear(
                &p / "o_proj",
                "self_attn.o_proj",
                (q, h, cfg.o_bias()),
                Split::Rows,
            )?,
            q_norm: norm("q_norm"),
            k_norm: norm("k_norm"),
            heads: divide(cfg.num_attention_heads, at.tp, "num_attention_heads")?,
            kv_heads: divide(cfg.kv_heads(), at.tp, "num_key_value_heads")?,
            head_dim: hd,
            output_gate,
            sinks,
            window: cfg.attention_window(at.index),
            softcap: cfg.attention_softcap(),
            query_scale: cfg.query_scale(),
            slot: at.slot,
        })
    }

    /// What this layer adds to plain causal attention, over all of its heads.
    pub(crate) fn variant(&self) -> AttentionVariant<'_> {
        AttentionVariant {
            sinks: self.sinks.as_ref(),
            window: self.window,
            softcap: self.softcap,
        }
    }

    /// The sink logits of heads `heads` (all of them: `0..heads`), if the layer has sinks.
    pub(crate) fn sinks_of(&self, heads: std::ops::Range<i64>) -> Option<Tensor> {
        self.sinks
            .as_ref()
            .map(|s| s.narrow(0, heads.start, heads.end - heads.start))
    }

    /// Attention of `x` (B, T, hidden) before the output projection: (B, T, heads * D), this
    /// rank's heads. `mask` (B, 1, T, S) boolean or `None` for plain causal attention over
    /// exactly the T given positions; with a cache, the new keys and values are appended to
    /// this layer's slot.
    fn core<R: Regions>(
        &self,
        regions: &mut R,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, R::Error> {
        let (b, t) = (x.size()[0], x.size()[1]);
        let (q, gate) = self.gated_query_heads(x, cos, sin);
        let [k, v] = self.key_value_heads(x, cos, sin);
        let (k, v) = match cache {
            Some(cache) => cache.update(self.slot, &k, &v),
            None => regions.keys_values(k, v)?,
        };
        let variant = self.variant();
        let y = if !variant.is_plain() {
            eager_attention::attend(&q, &k, &v, mask, &variant)
        } else if t == 1 && self.heads != self.kv_heads {
            // One query per sequence: fold each group of query heads that share a KV head into
            // the query-length axis, so attention reads every key/value once (no GQA expansion).
            let group = self.heads / self.kv_heads;
            let q = q.reshape([b, self.kv_heads, group, self.head_dim]);
            Tensor::scaled_dot_product_attention(&q, &k, &v, mask, 0.0, false, None, false)
        } else {
            let causal = mask.is_none() && t > 1;
            let gqa = self.heads != self.kv_heads;
            Tensor::scaled_dot_product_attention(&q, &k, &v, mask, 0.0, causal, None, gqa)
        };
        // The folded case's (B, KV, G, D) has the layout of (B, H, T, D).
        let y = self.heads_to_hidden(&y.reshape([b, self.heads, t, self.head_dim]));
        Ok(gated(y, gate))
    }
}

impl Attention {
    /// `x` (B, T, hidden) projected to `n` heads: (B, n, T, head_dim).
    fn heads(&self, x: &Tensor, proj: &Linear, n: i64, norm: &Option<RmsNorm>) -> Tensor {
        let (b, t) = (x.size()[0], x.size()[1]);
        let y = proj.forward(x).view([b, t, n, self.head_dim]);
        normed_heads(y, norm)
    }

    /// Attention outputs (B, len, hidden) of the queries at positions `[start, start+len)` of
    /// `x` (B, start+len, hidden), over the keys and values of all of `x`; `cos`, `sin` cover
    /// all of `x` and `mask` is (B, 1, len, start+len).
    pub fn forward_window(
        &self,
        x: &Tensor,
        start: i64,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
    ) -> Tensor {
        let len = x.size()[1] - start;
        let (q, gate) = self.gated_query_heads(
            &x.narrow(1, start, len),
            &cos.narrow(2, start, len),
            &sin.narrow(2, start, len),
        );
        let [k, v] = self.key_value_heads(x, cos, sin);
        let gqa = self.heads != self.kv_heads;
        let variant = self.variant();
        let y = if variant.is_plain() {
            Tensor::scaled_dot_product_attention(&q, &k, &v, Some(mask), 0.0, false, None, gqa)
        } else {
            eager_attention::attend(&q, &k, &v, Some(mask), &variant)
        };
        self.o_proj.forward(&gated(self.heads_to_hidden(&y), gate))
    }
}

impl Attention {
    /// Query, key and value heads `(B, n, T, D)` of `x` `(B, T, hidden)` at rotary tables
    /// `cos`, `sin` `(B, 1, T, D)` (packed tokens: `B` = 1), computed in transformers' order
    /// (q, then k, then v): in half precision the order of the three input-gradient terms
    /// changes the rounding of their sum. With Qwen3.5's output gate, also the gate
    /// `(B, T, heads * D)` of the same tokens (for [`Attention::merge_gated_heads`]).
    pub(crate) fn gated_qkv_heads(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> ([Tensor; 3], Option<Tensor>) {
        let (q, gate) = self.gated_query_heads(x, cos, sin);
        let [k, v] = self.key_value_heads(x, cos, sin);
        ([q, k, v], gate)
    }

    /// Query heads (rotated) of `x` and, with an output gate, the gate `(B, T, heads * D)`.
    fn gated_query_heads(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> (Tensor, Option<Tensor>) {
        let scaled = |q: Tensor| match self.query_scale {
            Some(f) => q * f,
            None => q,
        };
        if !self.output_gate {
            let q = self.heads(x, &self.q_proj, self.heads, &self.q_norm);
            return (scaled(apply_rotary(&q, cos, sin)), None);
        }
        let (b, t, d) = (x.size()[0], x.size()[1], self.head_dim);
        let both = self.q_proj.forward(x).view([b, t, self.heads, 2 * d]);
        let q = normed_heads(both.narrow(3, 0, d), &self.q_norm);
        let gate = both.narrow(3, d, d).reshape([b, t, self.heads * d]);
        (scaled(apply_rotary(&q, cos, sin)), Some(gate))
    }

    /// Key heads (rotated) and value heads of `x`; see [`Attention::gated_qkv_heads`].
    fn key_value_heads(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> [Tensor; 2] {
        let k = apply_rotary(
            &self.heads(x, &self.k_proj, self.kv_heads, &self.k_norm),
            cos,
            sin,
        );
        [k, self.heads(x, &self.v_proj, self.kv_heads, &None)]
    }

    /// The output projection of attention heads `(B, H, M, D)`, scaled by the output gate
    /// `(B, M, H * D)` when there is one: `(B, M, hidden)`.
    pub(crate) fn merge_gated_heads(&self, y: &Tensor, gate: Option<Tensor>) -> Tensor {
        self.o_proj.forward(&gated(self.heads_to_hidden(y), gate))
    }

    /// Heads `(B, H, M, D)` side by side: `(B, M, H * D)`.
    fn heads_to_hidden(&self, y: &Tensor) -> Tensor {
        let (b, m) = (y.size()[0], y.size()[2]);
        y.transpose(1, 2)
            .reshape([b, m, self.heads * self.head_dim])
    }

    /// Query and key/value head counts.
    pub(crate) fn head_counts(&self) -> (i64, i64) {
        (self.heads, self.kv_heads)
    }

    /// Packed attention: every token of `x` `(1, N, hidden)` over the keys of its span, or,
    /// with `queries`, only the tokens at those indices (the spans then count queries among
    /// them). Returns `(1, M, hidden)`.
    pub fn forward_packed(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        queries: Option<&Tensor>,
        spans: &[AttentionSpan],
    ) -> Tensor {
        let ((q, gate), [k, v]) = match queries {
            None => (
                self.gated_query_heads(x, cos, sin),
                self.key_value_heads(x, cos, sin),
            ),
            Some(idx) => {
                let kv = self.key_value_heads(x, cos, sin);
                let q = self.gated_query_heads(
                    &x.index_select(1, idx),
                    &cos.index_select(2, idx),
                    &sin.index_select(2, idx),
                );
                (q, kv)
            }
        };
        let y = attend_spans(&q, &k, &v, spans, &self.variant());
        self.o_proj.forward(&gated(self.heads_to_hidden(&y), gate))
    }
}

/// `y` `(B, T, n, D)` through the per-head norm, if any, as `(B, n, T, D)`.
fn normed_heads(y: Tensor, norm: &Option<RmsNorm>) -> Tensor {
    let y = match norm {
        Some(norm) => norm.forward(&y),
        None => y,
    };
    y.transpose(1, 2)
}

/// Attention output `(B, T, heads * D)` scaled by `sigmoid(gate)` when there is a gate.
fn gated(y: Tensor, gate: Option<Tensor>) -> Tensor {
    match gate {
        Some(g) => y * g.sigmoid(),
        None => y,
    }
}

/// What mixes tokens in a layer: self-attention, or (Qwen3.5) a Gated DeltaNet.
#[derive(Debug)]
pub enum Mixer {
    Attention(Attention),
    Linear(GatedDeltaNet),
}

impl Mixer {
    fn build(cfg: &ModelConfig, p: &Path, at: LayerPlace<'_>) -> Result<Self, String> {
        Ok(if cfg.linear_layer(at.index) {
            Mixer::Linear(GatedDeltaNet::build(cfg, p / "linear_attn", at)?)
        } else {
            Mixer::Attention(Attention::build(cfg, p / "self_attn", at)?)
        })
    }
}

/// Pre-norm residual block: attention then MLP.
#[derive(Debug)]
pub struct DecoderLayer {
    mixer: Mixer,
    mlp: FeedForward,
    input_layernorm: RmsNorm,
    /// The norm of the MLP's input (`post_attention_layernorm`, or under sandwich norms
    /// `pre_feedforward_layernorm`).
    mlp_norm: RmsNorm,
    /// Sandwich norms ([`ModelConfig::sandwich_norms`]): the mixer's output norm
    /// (`post_attention_layernorm`) and the MLP's (`post_feedforward_layernorm`).
    output_norms: Option<[RmsNorm; 2]>,
}

impl DecoderLayer {
    pub(crate) fn build(cfg: &ModelConfig, p: Path, at: LayerPlace<'_>) -> Result<Self, String> {
        let h = cfg.hidden_size;
        let norm = |name: &str| RmsNorm::of(cfg, &p / name, h);
        let (mlp_norm, output_norms) = if cfg.sandwich_norms() {
            (
                norm("pre_feedforward_layernorm"),
                Some([
                    norm("post_attention_layernorm"),
                    norm("post_feedforward_layernorm"),
                ]),
            )
        } else {
            (norm("post_attention_layernorm"), None)
        };
        Ok(DecoderLayer {
            mixer: Mixer::build(cfg, &p, at)?,
            mlp: FeedForward::build(cfg, &p / "mlp", at)?,
            input_layernorm: norm("input_layernorm"),
            mlp_norm,
            output_norms,
        })
    }

    /// The token mixer's output as the residual stream receives it (normed under sandwich
    /// norms).
    fn mixed(&self, y: Tensor) -> Tensor {
        match &self.output_norms {
            Some([after_mixer, _]) => after_mixer.forward(&y),
            None => y,
        }
    }

    /// The MLP's output as the residual stream receives it.
    fn mlp_out(&self, y: Tensor) -> Tensor {
        match &self.output_norms {
            Some([_, after_mlp]) => after_mlp.forward(&y),
            None => y,
        }
    }

    /// The layer's MLP (dense or sparse).
    pub fn feed_forward(&self) -> &FeedForward {
        &self.mlp
    }

    /// The layer's mixture-of-experts block, if its MLP is one.
    pub fn sparse_moe_mut(&mut self) -> Option<&mut SparseMoe> {
        match &mut self.mlp {
            FeedForward::Sparse(moe) => Some(moe),
            FeedForward::Dense(_) => None,
        }
    }

    /// The layer's token mixer.
    pub fn mixer(&self) -> &Mixer {
        &self.mixer
    }

    /// The layer with whole weights on tokens laid out as `layout` says (padded rows, a
    /// window of them, packed sequences); `cos`, `sin` are the rotary tables of `x`'s
    /// positions. Split weights go through [`DecoderLayer::forward_in`].
    pub fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        layout: TokenLayout<'_>,
    ) -> Tensor {
        match layout {
            TokenLayout::Padded { mask, valid, cache } => {
                infallible(self.forward_in(&mut Replicated, x, cos, sin, (mask, valid), cache))
            }
            TokenLayout::Window {
                start,
                len,
                mask,
                valid,
            } => self.window(x, start, len, cos, sin, mask, valid),
            TokenLayout::Packed { spans, queries } => self.packed(x, cos, sin, queries, spans),
        }
    }

    /// The layer as two segments through `regions`: norm, enter, attention, exit, residual;
    /// norm, enter, MLP, exit, residual (Megatron's four cuts under tensor parallelism).
    /// `x` (B, T, hidden) is the residual stream (under sequence parallelism this rank's chunk
    /// of it); `mask` (B, 1, T, S) or `None` for plain causal attention, and `valid` (B, T)
    /// the real tokens among the T (a linear-attention layer zeroes the others; `None`: all);
    /// with a cache, the layer's new keys and values (or its recurrent state) are stored.
    pub fn forward_in<R: Regions>(
        &self,
        regions: &mut R,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        (mask, valid): (Option<&Tensor>, Option<&Tensor>),
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, R::Error> {
        let h0 = regions.cut(x);
        let a = regions.enter(self.input_layernorm.forward(&h0))?;
        let attn = match &self.mixer {
            Mixer::Attention(at) => {
                let y = at.core(regions, &a, cos, sin, mask, cache)?;
                regions.exit(&at.o_proj, &y)?
            }
            Mixer::Linear(la) => {
                // The recurrence runs along whole sequences (under context parallelism every
                // rank computes all of it and keeps its own positions).
                let state = cache.and_then(|c| c.linear_state(la.slot));
                let (whole, whole_valid) = regions.whole_sequences(a, valid)?;
                let y = regions.own_positions(la.core(&whole, whole_valid.as_ref(), state))?;
                regions.exit(&la.out_proj, &y)?
            }
        };
        let h1 = regions.cut(&(&h0 + self.mixed(attn)));
        let m = regions.enter(self.mlp_norm.forward(&h1))?;
        let out = match &self.mlp {
            FeedForward::Dense(mlp) => regions.exit(&mlp.down_proj, &mlp.core(&m))?,
            FeedForward::Sparse(moe) => regions.experts(moe, &m, valid)?,
        };
        Ok(&h1 + self.mlp_out(out))
    }

    /// [`TokenLayout::Window`]: the outputs at positions `[start, start+len)` only.
    #[allow(clippy::too_many_arguments)]
    fn window(
        &self,
        x: &Tensor,
        start: i64,
        len: i64,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        valid: Option<&Tensor>,
    ) -> Tensor {
        // Positions after the window take no part: neither as queries nor, causally, as keys.
        let end = start + len;
        let (x, cos, sin) = (
            x.narrow(1, 0, end),
            cos.narrow(2, 0, end),
            sin.narrow(2, 0, end),
        );
        let normed = self.input_layernorm.forward(&x);
        let attn = match &self.mixer {
            Mixer::Attention(at) => at.forward_window(&normed, start, &cos, &sin, mask),
            Mixer::Linear(la) => {
                let valid = valid.map(|v| v.narrow(1, 0, end));
                la.forward(&normed, valid.as_ref(), None)
                    .narrow(1, start, len)
            }
        };
        let h = x.narrow(1, start, len) + self.mixed(attn);
        self.mlp_residual(&h)
    }
}

impl DecoderLayer {
    /// [`TokenLayout::Packed`] (see [`Attention::forward_packed`]).
    fn packed(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        queries: Option<&Tensor>,
        spans: &[AttentionSpan],
    ) -> Tensor {
        let normed = self.input_layernorm.forward(x);
        let attn = match &self.mixer {
            Mixer::Attention(at) => at.forward_packed(&normed, cos, sin, queries, spans),
            Mixer::Linear(la) => {
                let all = la.forward_spans(&normed, spans);
                match queries {
                    Some(idx) => all.index_select(1, idx),
                    None => all,
                }
            }
        };
        let attn = self.mixed(attn);
        let h = match queries {
            Some(idx) => x.index_select(1, idx) + attn,
            None => x + attn,
        };
        self.mlp_residual(&h)
    }

    /// The layer with its token mixer computed on the normed input by `attend` (attention)
    /// or `linear` (a Gated DeltaNet layer): Ulysses exchanges heads there.
    pub(crate) fn forward_with<E>(
        &self,
        x: &Tensor,
        attend: impl FnOnce(&Attention, &Tensor) -> Result<Tensor, E>,
        linear: impl FnOnce(&GatedDeltaNet, &Tensor) -> Result<Tensor, E>,
    ) -> Result<Tensor, E> {
        let normed = self.input_layernorm.forward(x);
        let mixed = match &self.mixer {
            Mixer::Attention(at) => attend(at, &normed)?,
            Mixer::Linear(la) => linear(la, &normed)?,
        };
        Ok(self.mlp_residual(&(x + self.mixed(mixed))))
    }

    fn mlp_residual(&self, h: &Tensor) -> Tensor {
        h + self.mlp_out(self.mlp.forward(&self.mlp_norm.forward(h)))
    }
}

/// How the tokens a layer reads are laid out, and which of its outputs are wanted: the one
/// argument by which a layer runs on whole weights (a Megatron rank's shards go through
/// [`DecoderLayer::forward_in`] with padded rows).
pub enum TokenLayout<'a> {
    /// Padded rows `(B, T)`: `mask` `(B, 1, T, S)` or `None` for plain causal attention,
    /// `valid` `(B, T)` the real tokens (a linear-attention layer zeroes the others; `None`:
    /// all); with a cache (decoding), the layer's new keys and values, or its recurrent
    /// state, are stored.
    Padded {
        mask: Option<&'a Tensor>,
        valid: Option<&'a Tensor>,
        cache: Option<&'a mut KvCache>,
    },
    /// Padded rows of which only the outputs at positions `[start, start+len)` are wanted
    /// (the last layer under a head that reads those alone, see [`Model::forward_window`]):
    /// `mask` is [`causal_window_mask`]'s, `valid` the real tokens (a linear-attention layer
    /// reads every position up to the window's end).
    Window {
        start: i64,
        len: i64,
        mask: &'a Tensor,
        valid: Option<&'a Tensor>,
    },
    /// Packed sequences `(1, N)` in `spans`; with `queries`, only those tokens' outputs
    /// `(1, M)`.
    Packed {
        spans: &'a [AttentionSpan],
        queries: Option<&'a Tensor>,
    },
}

/// The backbone (`model.*`): embeddings, decoder layers, final norm. Returns hidden states.
#[derive(Debug)]
pub struct Model {
    pub embed_tokens: Tensor,
    /// transformers' `padding_idx` (`pad_token_id`): that row of the embedding gets no
    /// gradient; -1 for none.
    padding_idx: i64,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    rotary: RotaryEmbedding,
    /// The on/off switch of the LoRA adapters (`config.lora`), if any.
    adapters: Option<Arc<AtomicBool>>,
    /// Whether any layer is a Gated DeltaNet (which reads the mask of real tokens).
    linear_layers: bool,
    /// What the embeddings are multiplied by (`sqrt(hidden_size)` for the families whose row says so).
    embedding_scale: Option<f64>,
}

impl Model {
    /// Registers the backbone under `p` (normally `vs.root() / "model"`). The config must have
    /// passed [`ModelConfig::validate`].
    pub fn new(cfg: &ModelConfig, p: Path) -> Result<Self, String> {
        let rotary = RotaryEmbedding::new(cfg, p.device())?;
        let embed_tokens = (&p / "embed_tokens").var(
            "weight",
            &[cfg.vocab_size, cfg.hidden_size],
            Init::Const(0.0),
        );
        let switch = cfg.lora.as_ref().map(|_| Arc::new(AtomicBool::new(true)));
        let vision = cfg.arch().is_ok_and(|a| a.has_vision());
        let ad = Adapters::of(cfg.lora.as_ref(), switch.as_ref(), vision);
        let layers = (0..cfg.num_hidden_layers as usize)
            .map(|i| {
                let at = LayerPlace {
                    index: i,
                    slot: i,
                    tp: 1,
                    adapters: ad,
                    experts: None,
                    expert_tp: 1,
                };
                DecoderLayer::build(cfg, &p / "layers" / i, at)
            })
            .collect::<Result<_, _>>()?;
        let norm = RmsNorm::of(cfg, &p / "norm", cfg.hidden_size);
        Ok(Model {
            embed_tokens,
            padding_idx: cfg.padding_idx(),
            layers,
            norm,
            rotary,
            adapters: switch,
            linear_layers: cfg.has_linear_layers(),
            embedding_scale: cfg.embedding_scale(),
        })
    }

    /// Embeddings of `ids` (as transformers' `nn.Embedding` with `padding_idx`).
    pub fn embed(&self, ids: &Tensor) -> Tensor {
        let x = Tensor::embedding(&self.embed_tokens, ids, self.padding_idx, false, false);
        scale_embeddings(x, self.embedding_scale)
    }

    /// [`Model::embed`], with libtorch's error as a value (for engines that propagate them).
    pub fn f_embed(&self, ids: &Tensor) -> Result<Tensor, tch::TchError> {
        let x = Tensor::f_embedding(&self.embed_tokens, ids, self.padding_idx, false, false)?;
        Ok(scale_embeddings(x, self.embedding_scale))
    }

    /// Switches the LoRA adapters on or off (no-op without adapters): off, the model computes
    /// as its base weights alone.
    pub fn set_adapters_enabled(&self, on: bool) {
        if let Some(s) = &self.adapters {
            s.store(on, Ordering::Relaxed);
        }
    }

    /// Whether the model has LoRA adapters.
    pub fn has_adapters(&self) -> bool {
        self.adapters.is_some()
    }

    /// The adapters' on/off switch, for other parts of the model to share (a vision tower's
    /// adapters go off with the text model's).
    pub(crate) fn adapter_switch(&self) -> Option<&Arc<AtomicBool>> {
        self.adapters.as_ref()
    }

    /// The decoder layers in order (for engines that run the backbone block by block).
    pub fn layers(&self) -> &[DecoderLayer] {
        &self.layers
    }

    /// The final RMSNorm (`model.norm`).
    pub fn final_norm(&self) -> &RmsNorm {
        &self.norm
    }

    /// The rotary embedding shared by every layer.
    pub fn rotary(&self) -> &RotaryEmbedding {
        &self.rotary
    }

    /// Hidden states (B, T, hidden) of `input_ids` (B, T) at `position_ids` (B, T).
    ///
    /// `attention_mask` (B, past+T), 1 for real tokens and 0 for padding, covers the cached
    /// positions too; `None` means no padding. With a cache, the new keys/values are appended.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        let x = self.embed(input_ids);
        let (cos, sin) = self.rotary.cos_sin(position_ids, x.kind());
        self.forward_embeds(InputEmbeds::tokens(x), (&cos, &sin), attention_mask, cache)
    }

    /// [`Model::forward`] of input embeddings `x` (B, T, hidden) with their rotary tables
    /// (a vision-language model's: text embeddings with vision embeddings in their
    /// placeholders, and multimodal rotary positions; Qwen3-VL's DeepStack features added to
    /// the first layers' outputs).
    pub fn forward_embeds(
        &self,
        embeds: InputEmbeds,
        (cos, sin): (&Tensor, &Tensor),
        attention_mask: Option<&Tensor>,
        mut cache: Option<&mut KvCache>,
    ) -> Tensor {
        let InputEmbeds { mut x, deepstack } = embeds;
        let (b, t) = (x.size()[0], x.size()[1]);
        let past = cache.as_ref().map_or(0, |c| c.len());
        let mask = match attention_mask {
            Some(m) => Some(causal_padding_mask(m, past, t)),
            None if past > 0 && t > 1 => {
                let ones = Tensor::ones([b, past + t], (Kind::Bool, x.device()));
                Some(causal_padding_mask(&ones, past, t))
            }
            None => None,
        };
        let valid = attention_mask
            .filter(|_| self.linear_layers)
            .map(|m| m.narrow(1, past, t));
        for (i, layer) in self.layers.iter().enumerate() {
            let layout = TokenLayout::Padded {
                mask: mask.as_ref(),
                valid: valid.as_ref(),
                cache: cache.as_deref_mut(),
            };
            x = layer.forward(&x, cos, sin, layout);
            x = with_deepstack(x, &deepstack, i);
        }
        if let Some(c) = cache {
            c.advance(t);
        }
        self.norm.forward(&x)
    }

    /// Packed embeddings `(1, N, hidden)` and rotary tables `(1, 1, N, D)` of a padded batch.
    fn packed_inputs(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        packing: &Packing,
    ) -> (Tensor, Tensor, Tensor) {
        let ids = packing.pack(input_ids);
        let pos = packing.pack(position_ids);
        let x = self.embed(&ids);
        let (cos, sin) = self.rotary.cos_sin(&pos, x.kind());
        (x, cos, sin)
    }

    /// Hidden states `(1, M, hidden)` of the packed tokens of `window` only, equal to
    /// [`Model::forward_window`]'s at those tokens: the padded batch runs without its padding
    /// (see [`super::packed`]); the last layer computes the window's queries alone.
    pub fn forward_packed_window(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        packing: &Packing,
        window: &PackedWindow,
    ) -> Tensor {
        let (x, cos, sin) = self.packed_inputs(input_ids, position_ids, packing);
        self.packed_window_layers(InputEmbeds::tokens(x), (&cos, &sin), packing, window)
    }

    /// [`Model::forward_packed_window`] of the padded batch's input embeddings `x`
    /// `(B, T, hidden)` (a vision-language model's, with vision embeddings in place).
    pub fn forward_packed_window_embeds(
        &self,
        x: &InputEmbeds,
        position_ids: &Tensor,
        packing: &Packing,
        window: &PackedWindow,
    ) -> Tensor {
        let x = infallible(x.map(|t| Ok(packing.pack(t))));
        let (cos, sin) = self.rotary.cos_sin(&packing.pack(position_ids), x.x.kind());
        self.packed_window_layers(x, (&cos, &sin), packing, window)
    }

    fn packed_window_layers(
        &self,
        embeds: InputEmbeds,
        (cos, sin): (&Tensor, &Tensor),
        packing: &Packing,
        window: &PackedWindow,
    ) -> Tensor {
        let InputEmbeds { mut x, deepstack } = embeds;
        let spans = packing.attention_spans();
        let Some((last, rest)) = self.layers.split_last() else {
            return self.norm.forward(&x.index_select(1, &window.tokens));
        };
        for (i, layer) in rest.iter().enumerate() {
            let layout = TokenLayout::Packed {
                spans: &spans,
                queries: None,
            };
            x = layer.forward(&x, cos, sin, layout);
            x = with_deepstack(x, &deepstack, i);
        }
        let layout = TokenLayout::Packed {
            spans: &window.spans,
            queries: Some(&window.tokens),
        };
        let x = last.forward(&x, cos, sin, layout);
        self.norm.forward(&x)
    }

    /// Hidden states (B, len, hidden) of positions `[start, start+len)` only, equal to
    /// `forward(..).narrow(1, start, len)`: the log-prob and value heads read only the positions
    /// that predict the response, so the last layer computes queries, attention output and MLP
    /// for those alone (keys and values for every position up to the window's end). In a model
    /// of L layers this saves about `(1 - len/T) / L` of the forward and backward.
    pub fn forward_window(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        start: i64,
        len: i64,
    ) -> Tensor {
        self.forward_window_embeds(
            InputEmbeds::tokens(self.embed(input_ids)),
            position_ids,
            attention_mask,
            start,
            len,
        )
    }

    /// [`Model::forward_window`] of input embeddings `x` `(B, T, hidden)` (a vision-language
    /// model's, with vision embeddings in place).
    pub fn forward_window_embeds(
        &self,
        embeds: InputEmbeds,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        start: i64,
        len: i64,
    ) -> Tensor {
        let t = embeds.x.size()[1];
        let (cos, sin) = self.rotary.cos_sin(position_ids, embeds.x.kind());
        let Some((last, rest)) = self.layers.split_last() else {
            return self
                .forward_embeds(embeds, (&cos, &sin), Some(attention_mask), None)
                .narrow(1, start, len);
        };
        let InputEmbeds { mut x, deepstack } = embeds;
        let mask = causal_padding_mask(attention_mask, 0, t);
        for (i, layer) in rest.iter().enumerate() {
            let layout = TokenLayout::Padded {
                mask: Some(&mask),
                valid: Some(attention_mask),
                cache: None,
            };
            x = layer.forward(&x, &cos, &sin, layout);
            x = with_deepstack(x, &deepstack, i);
        }
        let window_mask = causal_window_mask(attention_mask, start, len);
        let layout = TokenLayout::Window {
            start,
            len,
            mask: &window_mask,
            valid: Some(attention_mask),
        };
        let x = last.forward(&x, &cos, &sin, layout);
        self.norm.forward(&x)
    }
}

/// `x`, the output of layer `i`, plus the DeepStack level `i` when there is one (a
/// vision-language model's features at its image placeholders, zero elsewhere).
pub(crate) fn with_deepstack(x: Tensor, deepstack: &[Tensor], i: usize) -> Tensor {
    match deepstack.get(i) {
        Some(d) => x + d,
        None => x,
    }
}
