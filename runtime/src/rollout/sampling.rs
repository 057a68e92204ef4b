//! Choosing the next token from logits: greedy argmax, or temperature, top-k and top-p
//! filtering (in transformers' warper order) followed by inverse-CDF sampling with one uniform
//! number per sequence from that sequence's own seeded stream, so results do not depend on
//! libtorch's global generator, on batch composition or on other concurrent users. Masked
//! tokens ([`MaskedTokens`]) are out of every choice and of the log-probabilities' normaliser,
//! as in verl's vLLM rollout.

use tch::{Device, Kind, Tensor};

use crate::model::ModelConfig;
use crate::model::vision::Vision;
use crate::rng::Rng;

use super::{MaskedTokens, SamplingParams};

/// The tokens a policy of `cfg` with a tokenizer of `tokenizer_len` ids (added tokens included)
/// never samples, as verl's vLLM rollout masks them: the vocabulary's rows past the tokenizer,
/// and a vision-language model's image and video placeholders (verl masks those from 0.9.0;
/// before, a sampled placeholder failed the training step that met it, so verlc masks them
/// under every release).
pub fn masked_tokens(cfg: &ModelConfig, tokenizer_len: usize) -> MaskedTokens {
    let tokenizer_len = i64::try_from(tokenizer_len).unwrap_or(i64::MAX);
    let from = (tokenizer_len < cfg.vocab_size).then_some(tokenizer_len);
    let ids = match Vision::tokens_of(cfg) {
        Ok(t) if cfg.arch().is_ok_and(|a| a.has_vision()) => {
            vec![t.image_token_id, t.video_token_id]
        }
        _ => Vec::new(),
    };
    MaskedTokens { from, ids }
}

/// `logits` (..., V) with the masked tokens at minus infinity (the input itself when nothing
/// is masked).
pub fn mask_logits(logits: &Tensor, masked: &MaskedTokens) -> Tensor {
    let vocab = logits.size()[logits.dim() - 1];
    if masked.is_empty_for(vocab) {
        return logits.shallow_clone();
    }
    let mut out = logits.copy();
    if let Some(from) = masked.from.filter(|&f| f < vocab).map(|f| f.max(0)) {
        let _ = out.narrow(-1, from, vocab - from).fill_(f64::NEG_INFINITY);
    }
    let ids = masked.single_ids(vocab);
    if !ids.is_empty() {
        let index = Tensor::from_slice(&ids).to_device(out.device());
        let _ = out.index_fill_(-1, &index, f64::NEG_INFINITY);
    }
    out
}

/// Drops tokens outside the top `k` logits (`k <= 0`: keep all).
pub fn top_k_filter(logits: &Tensor, k: i64) -> Tensor {
    let vocab = logits.size()[logits.dim() - 1];
    if k <= 0 || k >= vocab {
        return logits.shallow_clone();
    }
    let (values, _) = logits.topk(k, -1, true, true);
    let kth = values.narrow(-1, k - 1, 1);
    logits.masked_fill(&logits.lt_tensor(&kth), f64::NEG_INFINITY)
}

/// Nucleus filtering: drops the least likely tokens whose cumulative probability is at most
/// `1 - p`, always keeping the most likely one (transformers' `TopPLogitsWarper`).
pub fn top_p_filter(logits: &Tensor, p: f64) -> Tensor {
    if p >= 1.0 {
        return logits.shallow_clone();
    }
    let (sorted, indices) = logits.sort(-1, false);
    let cum = sorted.softmax(-1, Kind::Float).cumsum(-1, Kind::Float);
    let remove = cum.le(1.0 - p);
    let last = remove.size()[1] - 1;
    let _ = remove.narrow(1, last, 1).fill_(0);
    let remove = remove.scatter(1, &indices, &remove);
    logits.masked_fill(&remove, f64::NEG_INFINITY)
}

/// The chosen tokens (N,) and their log-probabilities (N,) for logits (N, V).
///
/// Log-probabilities are taken under `log_softmax(logits / temperature)` before top-k/top-p
/// filtering (temperature 1 for greedy), which is the distribution the actor evaluates, with
/// the masked tokens (`params.masked`) left out.
/// `u` (N,) holds each row's uniform number for this token (see [`uniforms`]), on the logits'
/// device.
pub fn next_tokens(logits: &Tensor, params: &SamplingParams, u: &Tensor) -> (Tensor, Tensor) {
    let logits = mask_logits(&logits.to_kind(Kind::Float), &params.masked);
    if params.is_greedy() {
        let tokens = logits.argmax(-1, false);
        let logp = logits
            .log_softmax(-1, Kind::Float)
            .gather(-1, &tokens.unsqueeze(-1), false)
            .squeeze_dim(-1);
        return (tokens, logp);
    }
    let scaled = if params.temperature == 1.0 {
        logits
    } else {
        logits / params.temperature
    };
    let logp_all = scaled.log_softmax(-1, Kind::Float);
    let vocab = scaled.size()[1];
    let probs = if (params.top_k <= 0 || params.top_k >= vocab) && params.top_p >= 1.0 {
        logp_all.exp()
    } else {
        top_p_filter(&top_k_filter(&scaled, params.top_k), params.top_p).softmax(-1, Kind::Float)
    };
    let tokens = sample_at(&probs, u);
    let logp = logp_all
        .gather(-1, &tokens.unsqueeze(-1), false)
        .squeeze_dim(-1);
    (tokens, logp)
}

/// The next 24-bit uniform number in [0, 1) of a row's stream (one per sampled token).
fn uniform(rng: &mut Rng) -> f32 {
    (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32
}

/// The uniform numbers of `steps` tokens for each row: (rows, steps), column `t` for the
/// `t`-th token, drawn from each row's own stream in token order. Drawn before decoding and
/// moved to the device once, so choosing a token never waits for the host.
pub fn uniforms(rngs: &mut [Rng], steps: usize, device: Device) -> Tensor {
    let mut u = Vec::with_capacity(rngs.len() * steps);
    for rng in rngs.iter_mut() {
        u.extend((0..steps).map(|_| uniform(rng)));
    }
    Tensor::from_slice(&u)
        .view([rngs.len() as i64, steps as i64])
        .to_device(device)
}

/// One draw per row of `probs` (N, V) by inverse CDF with the row's generator.
pub fn sample(probs: &Tensor, rngs: &mut [Rng]) -> Tensor {
    let u = uniforms(rngs, 1, probs.device()).squeeze_dim(1);
    sample_at(probs, &u)
}

/// One draw per row of `probs` (N, V) by inverse CDF at the row's uniform number `u` (N,).
pub fn sample_at(probs: &Tensor, u: &Tensor) -> Tensor {
    let vocab = probs.size()[1];
    let cdf = probs.cumsum(-1, Kind::Float);
    // Shrinking the target by 2^-20 keeps it strictly below the total despite f32 rounding,
    // so the search never lands past the last token with mass.
    let target = u.unsqueeze(-1) * cdf.narrow(1, vocab - 1, 1) * (1.0 - 1.0 / (1u64 << 20) as f64);
    target
        .searchsorted(&cdf, false, true, "right", None::<Tensor>)
        .squeeze_dim(-1)
        .clamp_max(vocab - 1)
}
