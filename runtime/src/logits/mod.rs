//! What the trainer computes from a model's logits, whichever engine produced them: per-token
//! log-probs, entropy and `Σ π²` of given responses ([`logprob`]), and the top-k columns of
//! on-policy distillation ([`topk`]). The engines' forwards, the vocabulary-parallel cross
//! entropy (`crate::parallel::tp`) and the rollout all read them here.

pub mod logprob;
pub mod topk;

pub use logprob::{
    LogProbOutput, ProbsDiff, SequenceBatch, TokenStats, entropy_from_logits,
    log_probs_from_logits, probs_diff, response_log_probs, response_window,
    sum_pi_squared_from_logits,
};
