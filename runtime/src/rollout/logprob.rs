//! Log-probs of whole sequences through a model, without gradients (old and reference
//! log-probs, the rollout's recomputation after generation).

use tch::Tensor;

use crate::logits::logprob::{LogProbOutput, SequenceBatch, TokenStats, response_log_probs};
use crate::model::CausalLm;

use super::RolloutError;

/// [`response_log_probs`] without gradients, `micro_batch` rows at a time.
pub fn compute_log_probs(
    model: &CausalLm,
    batch: &SequenceBatch,
    response_len: i64,
    temperature: f64,
    micro_batch: usize,
    with_entropy: bool,
) -> Result<LogProbOutput, RolloutError> {
    let size = batch.input_ids.size();
    if size.len() != 2 || batch.attention_mask.size() != size || batch.position_ids.size() != size {
        return Err(RolloutError::Batch(format!(
            "input_ids {:?}, attention_mask {:?} and position_ids {:?} must be equal (N, T)",
            size,
            batch.attention_mask.size(),
            batch.position_ids.size()
        )));
    }
    if response_len < 1 || response_len >= size[1] || micro_batch == 0 || temperature <= 0.0 {
        return Err(RolloutError::Batch(format!(
            "need 0 < response_len ({response_len}) < T ({}), micro_batch > 0 and temperature > 0",
            size[1]
        )));
    }
    let (mut lps, mut ents) = (Vec::new(), Vec::new());
    tch::no_grad(|| {
        let mut start = 0;
        while start < size[0] {
            let len = (micro_batch as i64).min(size[0] - start);
            let mb = SequenceBatch {
                input_ids: &batch.input_ids.narrow(0, start, len),
                attention_mask: &batch.attention_mask.narrow(0, start, len),
                position_ids: &batch.position_ids.narrow(0, start, len),
            };
            let stats = TokenStats::entropy(with_entropy);
            let out = response_log_probs(model, &mb, response_len, temperature, stats);
            lps.push(out.log_probs);
            ents.extend(out.entropy);
            start += len;
        }
    });
    Ok(LogProbOutput {
        log_probs: Tensor::cat(&lps, 0),
        entropy: with_entropy.then(|| Tensor::cat(&ents, 0)),
        sum_pi_squared: None,
        topk: None,
    })
}
