//! Qwen3.5's linear-attention layer, the Gated DeltaNet (transformers'
//! `Qwen3_5GatedDeltaNet`, whose plain-torch path is the reference this file is tested
//! against).
//!
//! `in_proj_qkv` gives queries, keys and values side by side; a short depthwise causal
//! convolution (`conv1d`, width `linear_conv_kernel_dim`, SiLU) runs over them; queries and
//! keys are L2-normalised per head (and queries scaled by `1/sqrt(d_k)`). Each value head
//! keeps a `d_k x d_v` state `S`; per token, `S` decays by `exp(g)` with
//! `g = -exp(A_log) * softplus(a + dt_bias)` and takes a delta-rule write of strength
//! `beta = sigmoid(b)`: `S += k (beta (v - S^T k))^T`; the output `S^T q` goes through an
//! RMSNorm gated by `silu(z)` and `out_proj`.
//!
//! Two forms of the same recurrence: the chunked one (chunks of 64 tokens: within a chunk a
//! unit-lower-triangular solve condenses the delta-rule updates into matmuls; chunks are
//! scanned in order) trains and prefills; the recurrent one (token by token) decodes. Both
//! start from and return the state, so a prefill can hand over to decoding; the cache keeps
//! the state and the convolution's last inputs ([`LinearState`]). Padding tokens are zeroed
//! before the layer (as transformers does), so left padding leaves the state untouched.
use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

use super::ModelConfig;
use super::decoder::LayerPlace;
use super::layers::{Linear, RmsNorm, Split};
use super::packed::AttentionSpan;

/// The longest chunk of the chunked form (that of transformers' and FLA's kernels).
const CHUNK: i64 = 64;
const L2_EPS: f64 = 1e-6;

/// The per-token projections of a Gated DeltaNet layer's input: `mixed` (queries, keys and
/// values, before the convolution), `z` (the output gate), `b` and `a` (the write strength's
/// and decay's inputs), each `(B, T, ·)`.
#[derive(Debug)]
pub struct Projected {
    pub mixed: Tensor,
    pub z: Tensor,
    pub b: Tensor,
    pub a: Tensor,
}

/// Which heads a computation covers: part `part` of `parts` equal parts of the key heads and
/// of the value heads (value part `i` reads key part `i`: each key head serves a run of
/// consecutive value heads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadSlice {
    pub part: i64,
    pub parts: i64,
}

impl HeadSlice {
    /// Every head.
    pub const ALL: HeadSlice = HeadSlice { part: 0, parts: 1 };
}

/// What decoding carries for one Gated DeltaNet layer between forwards.
#[derive(Debug)]
pub struct LinearState {
    /// The last `kernel - 1` inputs of the convolution, `(B, conv_dim, kernel - 1)`.
    pub conv: Tensor,
    /// `(B, value_heads, d_k, d_v)` in f32.
    pub recurrent: Tensor,
}

impl LinearState {
    /// The zero state (an empty prefix) for `batch` rows.
    pub fn zeros(cfg: &ModelConfig, batch: i64, kind: Kind, device: tch::Device) -> Self {
        Self::zeros_part(cfg, batch, 1, kind, device)
    }

    /// The zero state of one of `parts` equal head parts (a tensor-parallel rank's heads).
    pub fn zeros_part(
        cfg: &ModelConfig,
        batch: i64,
        parts: i64,
        kind: Kind,
        device: tch::Device,
    ) -> Self {
        let l = &cfg.linear;
        let parts = parts.max(1);
        LinearState {
            conv: Tensor::zeros(
                [batch, l.conv_dim() / parts, l.linear_conv_kernel_dim - 1],
                (kind, device),
            ),
            recurrent: Tensor::zeros(
                [
                    batch,
                    l.linear_num_value_heads / parts,
                    l.linear_key_head_dim,
                    l.linear_value_head_dim,
                ],
                (Kind::Float, device),
            ),
        }
    }

    /// Rows `index` of this state.
    pub fn select_rows(&self, index: &Tensor) -> LinearState {
        LinearState {
            conv: self.conv.index_select(0, index),
            recurrent: self.recurrent.index_select(0, index),
        }
    }
}

#[derive(Debug)]
pub struct GatedDeltaNet {
    in_proj_qkv: Linear,
    in_proj_z: Linear,
    in_proj_b: Linear,
    in_proj_a: Linear,
    /// `(conv_dim, 1, kernel)`, depthwise, no bias.
    conv1d: Tensor,
    dt_bias: Tensor,
    a_log: Tensor,
    /// The gated RMSNorm's norm `(d_v,)` (a plain one: weights start at one).
    norm: RmsNorm,
    pub(crate) out_proj: Linear,
    key_heads: i64,
    value_heads: i64,
    key_dim: i64,
    value_dim: i64,
    kernel: i64,
    /// This layer's slot in a [`super::KvCache`].
    pub(crate) slot: usize,
}

impl GatedDeltaNet {
    /// Under tensor parallelism (`at.tp` ranks) the layer holds its rank's share of the key
    /// and value heads, as attention does: the rows of its projections (query, key and value
    /// channels each, [`crate::parallel::tp::ShardSpec::Sections`]), convolution channels and decay
    /// parameters of those heads, and `out_proj` split by rows; the norm is replicated.
    pub(crate) fn build(cfg: &ModelConfig, p: Path, at: LayerPlace<'_>) -> Result<Self, String> {
        let l = &cfg.linear;
        let tp = at.tp.max(1);
        let heads = |n: i64, what: &str| {
            if n % tp == 0 {
                Ok(n / tp)
            } else {
                Err(format!(
                    "layer {}: {n} linear-attention {what} heads cannot be split over tensor parallel {tp}",
                    at.index
                ))
            }
        };
        let (kh, nv) = (
            heads(l.linear_num_key_heads, "key")?,
            heads(l.linear_num_value_heads, "value")?,
        );
        let h = cfg.hidden_size;
        let linear = |name: &str, dims, split| {
            at.linear(&p / name, &format!("linear_attn.{name}"), dims, split)
        };
        let conv_dim = l.conv_dim() / tp;
        Ok(GatedDeltaNet {
            in_proj_qkv: linear("in_proj_qkv", (h, l.conv_dim(), false), Split::Columns)?,
            in_proj_z: linear("in_proj_z", (h, l.value_dim(), false), Split::Columns)?,
            in_proj_b: linear(
                "in_proj_b",
                (h, l.linear_num_value_heads, false),
                Split::Columns,
            )?,
            in_proj_a: linear(
                "in_proj_a",
                (h, l.linear_num_value_heads, false),
                Split::Columns,
            )?,
            conv1d: (&p / "conv1d").var(
                "weight",
                &[conv_dim, 1, l.linear_conv_kernel_dim],
                Init::Const(0.0),
            ),
            dt_bias: p.var("dt_bias", &[nv], Init::Const(1.0)),
            a_log: p.var("A_log", &[nv], Init::Const(0.0)),
            norm: RmsNorm::new(&p / "norm", l.linear_value_head_dim, cfg.rms_norm_eps),
            out_proj: linear("out_proj", (l.value_dim(), h, false), Split::Rows)?,
            key_heads: kh,
            value_heads: nv,
            key_dim: l.linear_key_head_dim,
            value_dim: l.linear_value_head_dim,
            kernel: l.linear_conv_kernel_dim,
            slot: at.slot,
        })
    }

    /// The per-token projections of `x` `(B, T, hidden)` (padding zeroed first when `valid`
    /// `(B, T)` is given).
    pub fn project(&self, x: &Tensor, valid: Option<&Tensor>) -> Projected {
        let x = match valid {
            Some(m) => x * m.to_kind(x.kind()).unsqueeze(-1),
            None => x.shallow_clone(),
        };
        Projected {
            mixed: self.in_proj_qkv.forward(&x),
            z: self.in_proj_z.forward(&x),
            b: self.in_proj_b.forward(&x),
            a: self.in_proj_a.forward(&x),
        }
    }

    /// The layer's output before `out_proj`: `(B, T, value_heads * d_v)` for `x` `(B, T,
    /// hidden)`. `valid` `(B, T)` marks real tokens (padding is zeroed first); `state`, when
    /// given, is the prefix's state and is replaced by the state after `x`.
    pub fn core(
        &self,
        x: &Tensor,
        valid: Option<&Tensor>,
        state: Option<&mut LinearState>,
    ) -> Tensor {
        self.mix(&self.project(x, valid), HeadSlice::ALL, state)
    }

    /// The recurrence over the projections `p` of heads `heads` (their channels only, in
    /// the order of [`GatedDeltaNet::select_heads`]): convolution, delta rule and gated norm;
    /// `(B, T, local value heads * d_v)`.
    pub fn mix(&self, p: &Projected, heads: HeadSlice, state: Option<&mut LinearState>) -> Tensor {
        let (b, t) = (p.mixed.size()[0], p.mixed.size()[1]);
        let (kh, vh) = (self.key_heads / heads.parts, self.value_heads / heads.parts);
        let beta = p.b.sigmoid();
        let (mixed, mut state) = match state {
            Some(s) => {
                let y = self.conv_with_state(&p.mixed.transpose(1, 2), &mut s.conv);
                (y.transpose(1, 2), Some(s))
            }
            None => (self.conv(&p.mixed, heads), None),
        };
        let mixed = mixed.silu();
        let (kd, vd) = (kh * self.key_dim, vh * self.value_dim);
        let parts = mixed.split_with_sizes([kd, kd, vd], -1);
        let q = parts[0].reshape([b, t, kh, self.key_dim]);
        let k = parts[1].reshape([b, t, kh, self.key_dim]);
        let v = parts[2].reshape([b, t, vh, self.value_dim]);
        let value = heads.part * vh;
        let a_log = self.a_log.narrow(0, value, vh).to_kind(Kind::Float);
        let dt_bias = self.dt_bias.narrow(0, value, vh).to_kind(Kind::Float);
        let g = -a_log.exp() * (p.a.to_kind(Kind::Float) + dt_bias).softplus();
        let initial = state.as_ref().map(|s| s.recurrent.shallow_clone());
        let (out, last) = if t == 1 && initial.is_some() {
            recurrent_gated_delta_rule(&q, &k, &v, &g, &beta, initial.as_ref())
        } else {
            chunk_gated_delta_rule(&q, &k, &v, &g, &beta, initial.as_ref())
        };
        if let Some(s) = state.as_mut() {
            s.recurrent = last.detach();
        }
        let out = gated_rms_norm(
            &out,
            &p.z.reshape([b, t, vh, self.value_dim]),
            &self.norm,
            p.mixed.kind(),
        );
        out.reshape([b, t, vd])
    }

    /// `core` then `out_proj`.
    pub fn forward(
        &self,
        x: &Tensor,
        valid: Option<&Tensor>,
        state: Option<&mut LinearState>,
    ) -> Tensor {
        self.out_proj.forward(&self.core(x, valid, state))
    }

    /// Packed tokens `x` `(1, N, hidden)`: each span's keys are one sequence, whose state
    /// starts empty. Tokens outside every span get zeros.
    pub fn forward_spans(&self, x: &Tensor, spans: &[AttentionSpan]) -> Tensor {
        let p = self.project(x, None);
        self.out_proj
            .forward(&self.mix_spans(&p, HeadSlice::ALL, spans))
    }

    /// [`GatedDeltaNet::mix`] over packed projections `p` `(1, N, ·)`, each span one sequence
    /// from an empty state: the spans run as one batch, right-padded to the longest (padding
    /// after a sequence cannot reach it); tokens outside every span get zeros.
    pub fn mix_spans(&self, p: &Projected, heads: HeadSlice, spans: &[AttentionSpan]) -> Tensor {
        let n = p.mixed.size()[1];
        let out_dim = self.value_heads / heads.parts * self.value_dim;
        let device = p.mixed.device();
        let longest = spans.iter().map(|s| s.key.len).max().unwrap_or(0);
        if longest == 0 {
            return Tensor::zeros([1, n, out_dim], (p.mixed.kind(), device));
        }
        let (mut packed, mut grid) = (Vec::new(), Vec::new());
        for (i, s) in spans.iter().enumerate() {
            for j in 0..s.key.len {
                packed.push(s.key.offset + j);
                grid.push(i as i64 * longest + j);
            }
        }
        let packed = Tensor::from_slice(&packed).to_device(device);
        let grid = Tensor::from_slice(&grid).to_device(device);
        let rows = spans.len() as i64;
        let batch = |t: &Tensor| {
            let c = t.size()[2];
            Tensor::zeros([rows * longest, c], (t.kind(), device))
                .index_copy(0, &grid, &t.select(0, 0).index_select(0, &packed))
                .reshape([rows, longest, c])
        };
        let batched = Projected {
            mixed: batch(&p.mixed),
            z: batch(&p.z),
            b: batch(&p.b),
            a: batch(&p.a),
        };
        let y = self
            .mix(&batched, heads, None)
            .reshape([rows * longest, out_dim]);
        Tensor::zeros([n, out_dim], (y.kind(), device))
            .index_copy(0, &packed, &y.index_select(0, &grid))
            .unsqueeze(0)
    }

    /// Key and value heads (in that order) per part when the heads split into `parts`
    /// equal parts (key heads and value heads each); `None` when they do not.
    pub fn heads_per_part(&self, parts: i64) -> Option<(i64, i64)> {
        (parts > 0 && self.key_heads % parts == 0 && self.value_heads % parts == 0)
            .then(|| (self.key_heads / parts, self.value_heads / parts))
    }

    /// Causal depthwise convolution of `x` `(B, T, C)` (the channels of `heads`) from an
    /// empty prefix, in f32 ([`causal_conv`]).
    fn conv(&self, x: &Tensor, heads: HeadSlice) -> Tensor {
        let w = if heads.parts == 1 {
            self.conv1d.shallow_clone()
        } else {
            let index = self.channels(heads).to_device(x.device());
            self.conv1d.index_select(0, &index)
        };
        causal_conv(x, &w)
    }

    /// The convolution continuing after the inputs in `prev` `(B, C, kernel - 1)`, which
    /// becomes the last `kernel - 1` inputs after `x`.
    fn conv_with_state(&self, x: &Tensor, prev: &mut Tensor) -> Tensor {
        let full = Tensor::cat(&[&prev.to_kind(x.kind()), x], 2);
        let n = full.size()[2];
        *prev = full
            .narrow(2, n - (self.kernel - 1), self.kernel - 1)
            .detach();
        let w = self.conv1d.to_kind(x.kind());
        full.conv1d(&w, None::<Tensor>, [1], [0], [1], x.size()[1])
    }

    /// The channels of `in_proj_qkv`'s output (and the convolution) that belong to `heads`:
    /// their queries, keys and values, in that order.
    fn channels(&self, heads: HeadSlice) -> Tensor {
        let (kh, vh) = (self.key_heads / heads.parts, self.value_heads / heads.parts);
        let (kd, vd) = (self.key_dim, self.value_dim);
        let key_block = self.key_heads * kd;
        let q = heads.part * kh * kd..(heads.part + 1) * kh * kd;
        let k = key_block + q.start..key_block + q.end;
        let v0 = 2 * key_block + heads.part * vh * vd;
        let index: Vec<i64> = q.chain(k).chain(v0..v0 + vh * vd).collect();
        Tensor::from_slice(&index)
    }

    /// The projections' channels of `heads`, each tensor's last dimension cut to them
    /// (what a rank of a head-split layer mixes).
    pub fn select_heads(&self, p: &Projected, heads: HeadSlice) -> Projected {
        let device = p.mixed.device();
        let vh = self.value_heads / heads.parts;
        let z0 = heads.part * vh * self.value_dim;
        Projected {
            mixed: p
                .mixed
                .index_select(-1, &self.channels(heads).to_device(device)),
            z: p.z.narrow(-1, z0, vh * self.value_dim),
            b: p.b.narrow(-1, heads.part * vh, vh),
            a: p.a.narrow(-1, heads.part * vh, vh),
        }
    }
}

/// The layer's output norm: the plain RMSNorm `norm` of `x` `(…, d_v)` times `silu(gate)`,
/// in `kind` (transformers' `Qwen3_5RMSNormGated`). On CPU one fused operation
/// (`csrc/gated_norm.cpp`, all in f32, rounded to `kind` once), elsewhere
/// [`gated_rms_norm_tensor_ops`].
pub fn gated_rms_norm(x: &Tensor, gate: &Tensor, norm: &RmsNorm, kind: Kind) -> Tensor {
    if x.device() == tch::Device::Cpu
        && crate::ops::have_cpu_kernels()
        && matches!(kind, Kind::Float | Kind::BFloat16)
    {
        let s = gate.to_kind(Kind::Float).silu();
        let bf16 = kind == Kind::BFloat16;
        let x = x.to_kind(Kind::Float);
        // Refused only for inputs outside its contract, which the lines above rule out.
        if let Ok(y) = crate::ops::gated_rms_norm(&x, &s, &norm.weight, norm.eps(), bf16) {
            return y;
        }
    }
    gated_rms_norm_tensor_ops(x, gate, norm, kind)
}

/// [`gated_rms_norm`] as transformers computes it: the norm in f32 cast to `kind` and scaled
/// by the weights there, times `silu(gate)` in f32, cast to `kind`.
pub fn gated_rms_norm_tensor_ops(x: &Tensor, gate: &Tensor, norm: &RmsNorm, kind: Kind) -> Tensor {
    let y = norm.forward(&x.to_kind(kind)).to_kind(Kind::Float) * gate.to_kind(Kind::Float).silu();
    y.to_kind(kind)
}

/// The Gated DeltaNet's causal depthwise convolution of `x` `(B, T, C)` with `w`
/// `(C, 1, kernel)` from an empty prefix, in that layout and in f32 (what the recurrence reads,
/// whatever the weights' dtype): `y[t] = sum_j w[j] * x[t - (kernel - 1) + j]` per channel. On
/// CPU one fused operation (`csrc/causal_conv.cpp`), elsewhere
/// [`causal_conv_tensor_ops`].
pub fn causal_conv(x: &Tensor, w: &Tensor) -> Tensor {
    if x.device() == tch::Device::Cpu && crate::ops::have_cpu_kernels() {
        let x = match x.kind() {
            Kind::BFloat16 | Kind::Float => x.shallow_clone(),
            _ => x.to_kind(Kind::Float),
        };
        // Refused only for inputs outside its contract, which the lines above rule out.
        if let Ok(y) = crate::ops::causal_conv(&x, &w.squeeze_dim(1)) {
            return y;
        }
    }
    causal_conv_tensor_ops(x, w)
}

/// [`causal_conv`] as `kernel` shifted products (cheaper, forward and backward, than a
/// depthwise `conv1d` with its transposes at these widths), on any device.
pub fn causal_conv_tensor_ops(x: &Tensor, w: &Tensor) -> Tensor {
    let (t, kernel) = (x.size()[1], w.size()[2]);
    let x = x.to_kind(Kind::Float);
    // (C, 1, kernel) -> (kernel, C): tap j of every channel.
    let taps = w.to_kind(Kind::Float).squeeze_dim(1).transpose(0, 1);
    let padded = x.constant_pad_nd([0, 0, kernel - 1, 0]);
    let mut y = padded.narrow(1, 0, t) * taps.get(0);
    for j in 1..kernel {
        y += padded.narrow(1, j, t) * taps.get(j);
    }
    y
}

fn l2norm(x: &Tensor) -> Tensor {
    x * ((x * x).sum_dim_intlist(-1, true, Kind::Float) + L2_EPS).rsqrt()
}

/// Queries, keys, values, decays and betas as `(B, H, T, …)` f32, with q/k L2-normalised,
/// q scaled by `1/sqrt(d_k)`, and each key head repeated for the value heads that read it.
fn prepare(q: &Tensor, k: &Tensor, v: &Tensor, g: &Tensor, beta: &Tensor) -> [Tensor; 5] {
    let rep = v.size()[2] / q.size()[2];
    let heads = |x: &Tensor| match rep {
        1 => x.shallow_clone(),
        _ => x.repeat_interleave_self_int(rep, 2, None),
    };
    let f = |x: &Tensor| x.transpose(1, 2).to_kind(Kind::Float).contiguous();
    let q = l2norm(&f(&heads(q)));
    let k = l2norm(&f(&heads(k)));
    let scale = query_scale(q.size()[3]);
    [q * scale, k, f(v), f(g), f(beta)]
}

/// What queries are scaled by after their normalisation: `1/sqrt(d_k)`.
fn query_scale(key_dim: i64) -> f64 {
    (key_dim as f64).powf(-0.5)
}

/// The state a pass starts from: `initial` in f32, or zeros of `shape` `(B, H, d_k, d_v)`.
fn start_state(initial: Option<&Tensor>, shape: [i64; 4], device: tch::Device) -> Tensor {
    match initial {
        Some(s) => s.to_kind(Kind::Float),
        None => Tensor::zeros(shape, (Kind::Float, device)),
    }
}

/// The chunked form: `(out (B, T, H, d_v) in q's dtype, final state (B, H, d_k, d_v))` for
/// queries and keys `(B, T, H_k, d_k)` (value head h reads key head `h / (H / H_k)`), values
/// `(B, T, H, d_v)`, log decays `g` and write strengths `beta` `(B, T, H)`. On CPU it runs as
/// one fused operation (`csrc/gated_delta_rule.cpp`), elsewhere as tensor ops
/// ([`chunk_gated_delta_rule_tensor_ops`]); both compute the same.
pub fn chunk_gated_delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial: Option<&Tensor>,
) -> (Tensor, Tensor) {
    if q.device() == tch::Device::Cpu
        && crate::ops::have_cpu_kernels()
        && let Some(r) = chunked_fused(q, k, v, g, beta, initial)
    {
        return r;
    }
    chunk_gated_delta_rule_tensor_ops(q, k, v, g, beta, initial)
}

/// The chunk length for `t` tokens: sequences shorter than a chunk run as one chunk of their
/// length rounded up to 8 (the algebra holds for any chunk length; RL prompts and responses
/// are often short).
fn chunk_len(t: i64) -> i64 {
    CHUNK.min((t.max(1) + 7) / 8 * 8)
}

/// The CPU kernel's pass; `None` only if it refused its inputs, which this builds to its
/// contract (f32, rows contiguous).
fn chunked_fused(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial: Option<&Tensor>,
) -> Option<(Tensor, Tensor)> {
    let kind = q.kind();
    let f32_rows = |x: &Tensor| {
        let x = x.to_kind(Kind::Float);
        if x.stride().last() == Some(&1) {
            x
        } else {
            x.contiguous()
        }
    };
    let [b, t, _, dk] = q.size()[..] else {
        return None;
    };
    let (h, dv) = (v.size()[2], v.size()[3]);
    let state = start_state(initial, [b, h, dk, dv], q.device()).contiguous();
    let (out, last) = crate::ops::chunk_gated_delta_rule(
        [
            &f32_rows(q),
            &f32_rows(k),
            &f32_rows(v),
            &g.to_kind(Kind::Float),
            &beta.to_kind(Kind::Float),
        ],
        &state,
        chunk_len(t),
        query_scale(dk),
    )
    .ok()?;
    Some((out.to_kind(kind), last))
}

/// [`chunk_gated_delta_rule`] by tensor ops on any device (what the CPU kernel is tested
/// against).
pub fn chunk_gated_delta_rule_tensor_ops(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial: Option<&Tensor>,
) -> (Tensor, Tensor) {
    let kind = q.kind();
    let [q, k, v, decay, beta] = prepare(q, k, v, g, beta);
    let (b, h, t, dk) = (k.size()[0], k.size()[1], k.size()[2], k.size()[3]);
    let dv = v.size()[3];
    let chunk = chunk_len(t);
    let pad = (chunk - t % chunk) % chunk;
    let pad_seq = |x: &Tensor| x.constant_pad_nd([0, 0, 0, pad]);
    let (q, k, v) = (pad_seq(&q), pad_seq(&k), pad_seq(&v));
    let (beta, decay) = (
        beta.constant_pad_nd([0, pad]),
        decay.constant_pad_nd([0, pad]),
    );
    let n = (t + pad) / chunk;
    let v_beta = &v * beta.unsqueeze(-1);
    let k_beta = &k * beta.unsqueeze(-1);
    let chunks = |x: &Tensor| x.reshape([b, h, n, chunk, x.size()[3]]);
    let (q, k, k_beta, v_beta) = (chunks(&q), chunks(&k), chunks(&k_beta), chunks(&v_beta));
    let decay = decay.reshape([b, h, n, chunk]);
    let device = q.device();
    let upper = Tensor::ones([chunk, chunk], (Kind::Bool, device)).triu(1);
    let cum = decay.cumsum(-1, Kind::Float);
    let pairwise = (cum.unsqueeze(-1) - cum.unsqueeze(-2))
        .masked_fill(&upper, f64::NEG_INFINITY)
        .exp();
    let kt = k.transpose(-1, -2);
    let system = k_beta.matmul(&kt) * &pairwise;
    let intra = q.matmul(&kt) * &pairwise;
    let decayed_k_beta = &k_beta * cum.exp().unsqueeze(-1);
    // (I + strictly-lower(system)) X = rhs: the diagonal is taken as one. Both right-hand
    // sides in one solve (one factor, one backward).
    let solved = system.linalg_solve_triangular(
        &Tensor::cat(&[&v_beta, &decayed_k_beta], -1),
        false,
        true,
        true,
    );
    let new_values = solved.narrow(-1, 0, dv);
    let k_cumdecay = solved.narrow(-1, dv, dk);
    let q = &q * cum.exp().unsqueeze(-1);
    let last = cum.narrow(-1, chunk - 1, 1);
    let k = &k * (&last - &cum).exp().unsqueeze(-1);
    let chunk_decay = last.exp().unsqueeze(-1); // (B, H, N, 1, 1)
    let mut state = start_state(initial, [b, h, dk, dv], device);
    let mut outs = Vec::with_capacity(n as usize);
    // Chunks as views of one unbind each: its backward stacks the chunks' gradients once
    // (a `select` per chunk would write a whole zero tensor per chunk).
    let (new_values, k_cumdecay) = (new_values.unbind(2), k_cumdecay.unbind(2));
    let (q, intra, k, chunk_decay) = (
        q.unbind(2),
        intra.unbind(2),
        k.unbind(2),
        chunk_decay.unbind(2),
    );
    for i in 0..n as usize {
        let v_new = &new_values[i] - k_cumdecay[i].matmul(&state);
        let inter = q[i].matmul(&state);
        outs.push(inter + intra[i].matmul(&v_new));
        state = &state * &chunk_decay[i] + k[i].transpose(-1, -2).matmul(&v_new);
    }
    let out = Tensor::stack(&outs, 2)
        .reshape([b, h, n * chunk, dv])
        .narrow(2, 0, t)
        .transpose(1, 2)
        .contiguous()
        .to_kind(kind);
    (out, state)
}

/// The recurrent form, token by token; the same inputs and outputs as
/// [`chunk_gated_delta_rule`].
pub fn recurrent_gated_delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial: Option<&Tensor>,
) -> (Tensor, Tensor) {
    let kind = q.kind();
    let [q, k, v, decay, beta] = prepare(q, k, v, g, beta);
    let (b, h, t, dk) = (k.size()[0], k.size()[1], k.size()[2], k.size()[3]);
    let dv = v.size()[3];
    let mut state = start_state(initial, [b, h, dk, dv], q.device());
    let mut outs = Vec::with_capacity(t as usize);
    for i in 0..t {
        let (q_t, k_t, v_t) = (q.select(2, i), k.select(2, i), v.select(2, i));
        state = &state * decay.select(2, i).exp().unsqueeze(-1).unsqueeze(-1);
        let kv_mem = (&state * k_t.unsqueeze(-1)).sum_dim_intlist(-2, false, Kind::Float);
        let delta = (v_t - kv_mem) * beta.select(2, i).unsqueeze(-1);
        state = &state + k_t.unsqueeze(-1) * delta.unsqueeze(-2);
        outs.push((&state * q_t.unsqueeze(-1)).sum_dim_intlist(-2, false, Kind::Float));
    }
    let out = Tensor::stack(&outs, 2)
        .transpose(1, 2)
        .contiguous()
        .to_kind(kind);
    (out, state)
}
