//! Log-probabilities and entropy of given responses, as verl's actor computes them
//! (`logits / temperature`, the positions that predict the response, `logprobs_from_logits`,
//! `entropy_from_logits`). [`response_log_probs`] is the training forward (with autograd when
//! enabled; `crate::rollout::compute_log_probs` runs it without gradients in micro-batches for
//! old/ref log-probs); [`probs_diff`] measures how far rollout log-probs are from them.

use tch::{Kind, Tensor};

use crate::model::CausalLm;

/// Full sequences (prompt then response), all (N, P + R).
#[derive(Debug, Clone, Copy)]
pub struct SequenceBatch<'a> {
    pub input_ids: &'a Tensor,
    pub attention_mask: &'a Tensor,
    pub position_ids: &'a Tensor,
}

/// Per-token log-probs (N, R) and, if asked, entropies and `Σ_v π_v²` (N, R), all f32.
#[derive(Debug)]
pub struct LogProbOutput {
    pub log_probs: Tensor,
    pub entropy: Option<Tensor>,
    /// `Σ_v softmax(logits)_v²` per token (verl 0.9's `calculate_sum_pi_squared`, read by the
    /// optimal-token-baseline estimators and the variance-proxy metrics).
    pub sum_pi_squared: Option<Tensor>,
    /// The top-k output of on-policy distillation's `forward_kl_topk`, when asked.
    pub topk: Option<super::topk::TopKOutput>,
}

/// Which per-token statistics a forward computes besides the log-prob.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenStats {
    pub entropy: bool,
    pub sum_pi_squared: bool,
}

impl TokenStats {
    /// Log-probs with or without the entropy.
    pub fn entropy(on: bool) -> Self {
        TokenStats {
            entropy: on,
            sum_pi_squared: false,
        }
    }

    /// The statistics beyond the log-prob, in the order columns and planes carry them.
    pub fn count(self) -> i64 {
        i64::from(self.entropy) + i64::from(self.sum_pi_squared)
    }
}

/// `log_softmax(logits)[label]` in f32, for logits (…, V) and labels (…).
pub fn log_probs_from_logits(logits: &Tensor, labels: &Tensor) -> Tensor {
    let logits = logits.to_kind(Kind::Float);
    let picked = logits
        .gather(-1, &labels.unsqueeze(-1), false)
        .squeeze_dim(-1);
    picked - logits.logsumexp(-1, false)
}

/// Entropy of `softmax(logits)` in f32: `logsumexp(l) - sum(softmax(l) * l)`.
pub fn entropy_from_logits(logits: &Tensor) -> Tensor {
    let logits = logits.to_kind(Kind::Float);
    let p = logits.softmax(-1, Kind::Float);
    logits.logsumexp(-1, false) - (p * &logits).sum_dim_intlist(-1, false, Kind::Float)
}

/// `Σ_v softmax(logits)_v²` in f32, for logits (…, V).
pub fn sum_pi_squared_from_logits(logits: &Tensor) -> Tensor {
    logits
        .softmax(-1, Kind::Float)
        .square()
        .sum_dim_intlist(-1, false, Kind::Float)
}

/// Log-probs (and the asked statistics) of the last `response_len` tokens of each row under
/// the model, through the same forward as training; gradients flow when enabled by the caller.
pub fn response_log_probs(
    model: &CausalLm,
    batch: &SequenceBatch,
    response_len: i64,
    temperature: f64,
    stats: TokenStats,
) -> LogProbOutput {
    let (hidden, labels) = response_window(model, batch, response_len);
    let mut logits = model.logits(&hidden);
    if temperature != 1.0 {
        logits /= temperature;
    }
    LogProbOutput {
        log_probs: log_probs_from_logits(&logits, &labels),
        entropy: stats.entropy.then(|| entropy_from_logits(&logits)),
        sum_pi_squared: stats
            .sum_pi_squared
            .then(|| sum_pi_squared_from_logits(&logits)),
        topk: None,
    }
}

/// The final hidden states `(N, R, hidden)` of the positions that predict the last
/// `response_len` tokens of each row, and those tokens `(N, R)`.
pub fn response_window(
    model: &CausalLm,
    batch: &SequenceBatch,
    response_len: i64,
) -> (Tensor, Tensor) {
    let total = batch.input_ids.size()[1];
    let hidden = model.model.forward_window(
        batch.input_ids,
        batch.position_ids,
        batch.attention_mask,
        total - response_len - 1,
        response_len,
    );
    let labels = batch
        .input_ids
        .narrow(1, total - response_len, response_len);
    (hidden, labels)
}

/// verl's rollout-vs-training probability metrics over masked tokens
/// (`training/rollout_probs_diff_{max,mean,std}`, `training/rollout_actor_probs_pearson_corr`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbsDiff {
    pub max: f64,
    pub mean: f64,
    pub std: f64,
    pub pearson: f64,
}

pub fn probs_diff(
    rollout_log_probs: &Tensor,
    actor_log_probs: &Tensor,
    mask: &Tensor,
) -> ProbsDiff {
    let m = mask.to_kind(Kind::Bool);
    let a = rollout_log_probs
        .to_kind(Kind::Double)
        .exp()
        .masked_select(&m);
    let b = actor_log_probs
        .to_kind(Kind::Double)
        .exp()
        .masked_select(&m);
    if a.numel() == 0 {
        return ProbsDiff {
            max: 0.0,
            mean: 0.0,
            std: 0.0,
            pearson: f64::NAN,
        };
    }
    let d = (&a - &b).abs();
    let (da, db) = (&a - a.mean(Kind::Double), &b - b.mean(Kind::Double));
    let denom = (da.square().sum(Kind::Double) * db.square().sum(Kind::Double)).sqrt();
    let pearson = (&da * &db).sum(Kind::Double) / denom;
    ProbsDiff {
        max: d.max().double_value(&[]),
        mean: d.mean(Kind::Double).double_value(&[]),
        std: if d.numel() > 1 {
            d.std(true).double_value(&[])
        } else {
            0.0
        },
        pearson: pearson.double_value(&[]),
    }
}
