//! verl's supervised fine-tuning loss (`sft_loss`, no_padding mode) on a packed batch: the
//! micro-batch's samples laid end to end in one dimension, as verl's jagged tensors hold them.

use tch::{Kind, Tensor};

/// Minus the log-probabilities over the loss mask, summed, over the global step's loss tokens,
/// times the data-parallel size (the gradient all-reduce averages over ranks, so the step's
/// gradient is that of the token mean over every rank and micro-batch).
///
/// `log_probs[t]` is the log-probability of the token after position `t` in the packed batch, so
/// the mask is shifted one token left to line up (`loss_mask[t + 1]` weighs `log_probs[t]`),
/// across sample boundaries and wrapping at the end as verl's `torch.roll` does: a sample's
/// first token never trains (it is never an assistant reply's), which keeps the log-probability
/// of the next sample's first token out of the loss. `batch_num_tokens` counts the step's loss
/// tokens on every rank.
pub fn sft_loss(
    log_probs: &Tensor,
    loss_mask: &Tensor,
    batch_num_tokens: f64,
    dp_size: usize,
) -> Tensor {
    let mask = loss_mask.roll([-1], [0]).to_kind(log_probs.kind());
    (log_probs * mask).sum(log_probs.kind()).neg() / batch_num_tokens * dp_size as f64
}

/// The loss tokens of a packed batch's mask (verl's `batch_num_tokens` sums this over the step's
/// micro-batches and ranks).
pub fn loss_tokens(loss_mask: &Tensor) -> f64 {
    loss_mask
        .to_kind(Kind::Double)
        .sum(Kind::Double)
        .double_value(&[])
}

/// [`sft_loss`] on rows: `log_probs` and `mask` `(N, R)` on the grid of each row's tokens
/// after the first (the mask already shifted onto the tokens it weighs), normalised by the
/// step's loss tokens over every rank (`agg.batch_num_tokens`) times the data-parallel size.
pub fn sft_loss_rows(
    log_probs: &Tensor,
    mask: &Tensor,
    agg: &crate::algo::AggOptions,
) -> Result<Tensor, tch::TchError> {
    let tokens = agg.batch_num_tokens.unwrap_or(0.0);
    let masked = (log_probs * mask.f_to_kind(log_probs.kind())?).f_sum(log_probs.kind())?;
    if tokens <= 0.0 {
        // No assistant token in the whole step: nothing to learn; a zero that keeps the graph.
        return masked.f_mul_scalar(0.0);
    }
    masked
        .f_neg()?
        .f_div_scalar(tokens)?
        .f_mul_scalar(agg.dp_size as f64)
}

/// verl 0.7.0's legacy SFT trainer's loss of one micro-batch (`fsdp_sft_trainer`'s
/// `_compute_loss_and_backward`): minus the masked log-probs summed, over `tokens + 1e-8`
/// (the micro-batch's own loss tokens, or with `balance_dp_token` their sum over every rank),
/// times `scale` (1, or the data-parallel size with `balance_dp_token`), over the step's
/// micro-batch count. The ranks' gradients are then averaged, so the update is the mean over
/// ranks and micro-batches of each micro-batch's token mean: not the step's token mean.
pub fn sft_loss_legacy(
    log_probs: &Tensor,
    mask: &Tensor,
    tokens: f64,
    scale: f64,
    micro_batches: usize,
) -> Result<Tensor, tch::TchError> {
    let masked = (log_probs * mask.f_to_kind(log_probs.kind())?).f_sum(log_probs.kind())?;
    masked
        .f_neg()?
        .f_div_scalar(tokens + 1e-8)?
        .f_mul_scalar(scale)?
        .f_div_scalar(micro_batches.max(1) as f64)
}
