//! Preallocated key/value cache for incremental decoding, and attention-mask helpers.

use tch::{Device, Kind, Tensor};

use super::ModelConfig;
use super::gated_deltanet::LinearState;

/// What decoding carries per layer: keys and values of every attention layer, preallocated
/// to `capacity` positions (`k[l]`, `v[l]` have shape (batch, kv_heads, capacity, head_dim)),
/// and the recurrent and convolution state of every linear-attention layer (Qwen3.5's Gated
/// DeltaNet, whose K/V slots hold no positions). Positions `[0, len)` are filled; a forward
/// with a cache writes its new positions at `len` and advances it.
#[derive(Debug)]
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    linear: Vec<Option<LinearState>>,
    len: i64,
    capacity: i64,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, batch: i64, capacity: i64, kind: Kind, device: Device) -> Self {
        let layers = cfg.num_hidden_layers as usize;
        // A linear-attention layer's K/V slot holds no positions; its state is `linear`.
        let dims = (batch, cfg.kv_heads(), cfg.head_dim(), kind, device);
        let mut cache = Self::allocate(layers, dims, capacity, |l| cfg.linear_layer(l));
        for l in (0..layers).filter(|&l| cfg.linear_layer(l)) {
            cache.linear[l] = Some(LinearState::zeros(cfg, batch, kind, device));
        }
        cache
    }

    /// The state of linear-attention layer `slot` (`None` for attention layers).
    pub(crate) fn linear_state(&mut self, slot: usize) -> Option<&mut LinearState> {
        self.linear.get_mut(slot).and_then(Option::as_mut)
    }

    /// A cache for the model's layers `layers` (a pipeline stage's) holding one of `tp` equal
    /// parts of each layer's heads (a tensor-parallel rank's): keys and values of attention
    /// layers, the recurrent and convolution state of linear-attention layers.
    pub fn for_layers(
        cfg: &ModelConfig,
        layers: std::ops::Range<usize>,
        (batch, tp, capacity): (i64, i64, i64),
        kind: Kind,
        device: Device,
    ) -> Self {
        let start = layers.start;
        let dims = (
            batch,
            cfg.kv_heads() / tp.max(1),
            cfg.head_dim(),
            kind,
            device,
        );
        let linear = |slot: usize| cfg.linear_layer(start + slot);
        let mut cache = Self::allocate(layers.len(), dims, capacity, linear);
        for slot in (0..layers.len()).filter(|&s| linear(s)) {
            cache.linear[slot] = Some(LinearState::zeros_part(cfg, batch, tp, kind, device));
        }
        cache
    }

    /// Zero keys and values for `layers` layers of `(batch, kv_heads, head_dim, kind, device)`,
    /// `capacity` positions each except the layers `empty` names (none), and no linear state.
    fn allocate(
        layers: usize,
        (batch, kv_heads, head_dim, kind, device): (i64, i64, i64, Kind, Device),
        capacity: i64,
        empty: impl Fn(usize) -> bool,
    ) -> Self {
        let slot = |l: usize| {
            let len = if empty(l) { 0 } else { capacity };
            Tensor::zeros([batch, kv_heads, len, head_dim], (kind, device))
        };
        KvCache {
            k: (0..layers).map(slot).collect(),
            v: (0..layers).map(slot).collect(),
            linear: (0..layers).map(|_| None).collect(),
            len: 0,
            capacity,
        }
    }

    /// Filled positions.
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> i64 {
        self.capacity
    }

    pub fn batch(&self) -> i64 {
        self.k.first().map_or(0, |t| t.size()[0])
    }

    /// Writes `k`, `v` (B, kv_heads, T, D) of layer `layer` at `[len, len+T)` and returns the
    /// keys and values of `[0, len+T)`.
    pub(crate) fn update(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let t = k.size()[2];
        assert!(
            self.len + t <= self.capacity,
            "KV cache overflow: {} + {t} > {}",
            self.len,
            self.capacity
        );
        self.k[layer].narrow(2, self.len, t).copy_(k);
        self.v[layer].narrow(2, self.len, t).copy_(v);
        (
            self.k[layer].narrow(2, 0, self.len + t),
            self.v[layer].narrow(2, 0, self.len + t),
        )
    }

    /// Marks `t` more positions as filled (called once per forward, after all layers).
    pub(crate) fn advance(&mut self, t: i64) {
        self.len += t;
    }

    /// A cache whose row `i` is row `index[i]` of this one (e.g. `n` samples per prompt after
    /// a shared prefill), with room for `capacity` positions.
    pub fn select_rows(&self, index: &Tensor, capacity: i64) -> KvCache {
        let grow = |t: &Tensor| {
            let rows = t.index_select(0, index);
            let s = rows.size();
            if s[2] == 0 {
                return rows; // a linear-attention layer's empty K/V slot
            }
            let out = Tensor::zeros([s[0], s[1], capacity, s[3]], (rows.kind(), rows.device()));
            out.narrow(2, 0, self.len)
                .copy_(&rows.narrow(2, 0, self.len));
            out
        };
        KvCache {
            k: self.k.iter().map(grow).collect(),
            v: self.v.iter().map(grow).collect(),
            linear: self
                .linear
                .iter()
                .map(|s| s.as_ref().map(|s| s.select_rows(index)))
                .collect(),
            len: self.len,
            capacity,
        }
    }
}

/// The boolean attention mask (B, 1, T, past+T) for queries at positions `[past, past+T)`:
/// causal, restricted to keys where `key_valid` (B, past+T) is true. Each query may always
/// see itself, so padding rows never become all-masked (their outputs are ignored).
pub fn causal_padding_mask(key_valid: &Tensor, past: i64, t: i64) -> Tensor {
    let total = past + t;
    let device = key_valid.device();
    let q = Tensor::arange_start(past, total, (Kind::Int64, device)).view([t, 1]);
    let k = Tensor::arange(total, (Kind::Int64, device)).view([1, total]);
    let causal = k.le_tensor(&q);
    let diag = k.eq_tensor(&q);
    let valid = key_valid.to_kind(Kind::Bool).view([-1, 1, 1, total]);
    causal.logical_and(&valid).logical_or(&diag)
}

/// [`causal_padding_mask`] for the queries at `[start, start+len)` over the keys up to the
/// window's end only: (B, 1, len, start+len). What a layer computing just that window reads.
pub fn causal_window_mask(key_valid: &Tensor, start: i64, len: i64) -> Tensor {
    causal_padding_mask(&key_valid.narrow(1, 0, start + len), start, len)
}

/// Positions from a 0/1 attention mask (B, T): `cumsum - 1`, padding set to 1 (as transformers).
pub fn position_ids_from_mask(attention_mask: &Tensor) -> Tensor {
    let m = attention_mask.to_kind(Kind::Int64);
    let pos = m.cumsum(-1, Kind::Int64) - 1;
    pos.masked_fill(&m.eq(0), 1)
}
