//! Attention computed in full (scores, mask, softmax, values) for what libtorch's fused
//! `scaled_dot_product_attention` cannot express: a learned sink logit per head that joins
//! each softmax's denominator and attends to nothing, and a sliding window that limits each
//! query to the keys shortly before it, and scores soft-capped before the mask (`cap ·
//! tanh(score / cap)`), as family rows name them. Attention with none of these keeps the
//! fused kernel ([`AttentionVariant::is_plain`]).

use tch::{Kind, Tensor};

/// What an attention layer adds to plain causal attention.
#[derive(Debug, Default)]
pub struct AttentionVariant<'a> {
    /// One logit per query head `(H,)` (this rank's heads).
    pub sinks: Option<&'a Tensor>,
    /// Each query sees the keys less than this many positions before it, itself included.
    pub window: Option<i64>,
    /// Each score (after scaling) becomes `cap · tanh(score / cap)`.
    pub softcap: Option<f64>,
}

impl AttentionVariant<'_> {
    /// Plain attention: the fused kernel computes it.
    pub fn is_plain(&self) -> bool {
        self.sinks.is_none() && self.window.is_none() && self.softcap.is_none()
    }
}

/// Causal attention of queries `q` `(B, H, T, D)` over keys and values `(B, KV, S, D)`
/// (`KV` dividing `H`), the queries being the last `T` of the `S` positions (bottom-right
/// alignment: query `i` is at position `S - T + i`), restricted further by `mask`
/// (boolean, broadcast to `(B, H, T, S)`, true where a key may be seen) and by `variant`'s
/// window, with its sinks in the softmax and its cap on the scores. Returns `(B, H, T, D)`; differentiable in every
/// input and in the sinks. Positions are indices along the key axis: the callers' rows hold
/// each sequence's tokens contiguously (left-padded prompts, packed spans, a KV cache), so
/// index distance is position distance wherever the mask lets a query see a key.
pub fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    variant: &AttentionVariant,
) -> Tensor {
    let (b, h, t, d) = (q.size()[0], q.size()[1], q.size()[2], q.size()[3]);
    let (kv, s) = (k.size()[1], k.size()[2]);
    let (k, v) = if kv != h {
        (
            k.repeat_interleave_self_int(h / kv, Some(1), None),
            v.repeat_interleave_self_int(h / kv, Some(1), None),
        )
    } else {
        (k.shallow_clone(), v.shallow_clone())
    };
    let mut scores = q.matmul(&k.transpose(-2, -1)) * (d as f64).powf(-0.5);
    if let Some(cap) = variant.softcap {
        scores = (scores / cap).tanh() * cap;
    }
    let device = q.device();
    let qpos = Tensor::arange_start(s - t, s, (Kind::Int64, device)).view([t, 1]);
    let kpos = Tensor::arange(s, (Kind::Int64, device)).view([1, s]);
    let mut allowed = kpos.le_tensor(&qpos);
    if let Some(w) = variant.window {
        allowed = allowed.logical_and(&(&qpos - &kpos).lt(w));
    }
    if let Some(m) = mask {
        allowed = allowed.logical_and(m);
    }
    let scores = scores.masked_fill(&allowed.logical_not(), f64::NEG_INFINITY);
    let probs = match variant.sinks {
        None => scores.softmax(-1, scores.kind()),
        Some(sinks) => {
            let sink = sinks
                .to_kind(scores.kind())
                .view([1, h, 1, 1])
                .expand([b, h, t, 1], false);
            Tensor::cat(&[scores, sink], -1)
                .softmax(-1, q.kind())
                .narrow(-1, 0, s)
        }
    };
    probs.matmul(&v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// Without sinks or window it is the fused kernel's causal attention; a window as wide
    /// as the sequence changes nothing; sinks that are very negative change nothing.
    #[test]
    fn plain_cases_equal_the_fused_kernel() {
        tch::manual_seed(0);
        let opts = (Kind::Double, Device::Cpu);
        let q = Tensor::randn([2, 4, 5, 8], opts);
        let k = Tensor::randn([2, 2, 5, 8], opts);
        let v = Tensor::randn([2, 2, 5, 8], opts);
        let fused =
            Tensor::scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, true, None, true);
        let plain = attend(&q, &k, &v, None, &AttentionVariant::default());
        assert!(plain.allclose(&fused, 1e-10, 1e-10, false));
        let wide = AttentionVariant {
            sinks: None,
            window: Some(5),
            softcap: None,
        };
        assert!(attend(&q, &k, &v, None, &wide).allclose(&fused, 1e-10, 1e-10, false));
        let sinks = Tensor::full([4], -1e4, opts);
        let sunk = AttentionVariant {
            sinks: Some(&sinks),
            window: None,
            softcap: None,
        };
        assert!(attend(&q, &k, &v, None, &sunk).allclose(&fused, 1e-10, 1e-10, false));
        // A window of one: each query sees itself alone.
        let one = AttentionVariant {
            sinks: None,
            window: Some(1),
            softcap: None,
        };
        let own = v.repeat_interleave_self_int(2, Some(1), None);
        assert!(attend(&q, &k, &v, None, &one).allclose(&own, 1e-10, 1e-10, false));
    }

    /// Soft-capping bounds every score by the cap before the causal mask: a cap far above the
    /// scores changes nothing, and a small one equals the softmax of `cap · tanh(score / cap)`
    /// written out.
    #[test]
    fn soft_capping_caps_scores_before_the_mask() {
        tch::manual_seed(1);
        let opts = (Kind::Double, Device::Cpu);
        let q = Tensor::randn([1, 2, 4, 8], opts) * 3.0;
        let k = Tensor::randn([1, 2, 4, 8], opts) * 3.0;
        let v = Tensor::randn([1, 2, 4, 8], opts);
        let fused =
            Tensor::scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, true, None, true);
        let capped = |cap: f64| AttentionVariant {
            sinks: None,
            window: None,
            softcap: Some(cap),
        };
        assert!(attend(&q, &k, &v, None, &capped(1e9)).allclose(&fused, 1e-9, 1e-9, false));
        let cap = 0.5;
        let scores = q.matmul(&k.transpose(-2, -1)) / 8f64.sqrt();
        let scores = (scores / cap).tanh() * cap;
        let future = Tensor::ones([4, 4], (Kind::Bool, Device::Cpu)).triu(1);
        let expected = scores
            .masked_fill(&future, f64::NEG_INFINITY)
            .softmax(-1, Kind::Double)
            .matmul(&v);
        let got = attend(&q, &k, &v, None, &capped(cap));
        assert!(got.allclose(&expected, 1e-12, 1e-12, false));
        assert!(!got.allclose(&fused, 1e-3, 1e-3, false));
    }
}
