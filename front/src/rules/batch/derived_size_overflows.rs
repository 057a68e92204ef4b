//! ## What it checks
//! That the numbers verl derives from the config fit 64-bit integers with room to spare
//! (below 2^62): the world size (`trainer.nnodes × trainer.n_gpus_per_node`), the sequence
//! length (`max_prompt_length + max_response_length`), the tokens of a step
//! (`train_batch_size × rollout.n × sequence length`), mini-batches times `rollout.n`,
//! micro-batch token budgets, Megatron's model-parallel size, and, with the model's
//! `config.json`, its parameter, activation and logit bytes.
//!
//! ## Why
//! Each factor may pass its own range check while the product wraps around. Python's
//! integers do not overflow, so verl would try to allocate for it; verlc's other rules would
//! judge a saturated number. They are skipped while this rule reports.
//!
//! ## Example
//! ```yaml
//! trainer:
//!   nnodes: 4294967296
//!   n_gpus_per_node: 4294967296
//! ```
//!
//! ## Fix
//! Give the sizes the run really has.

use crate::codes::SIZE_OVERFLOW;
use crate::diag::Diagnostic;
use crate::rules::RuleContext;

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let Err(overflow) = super::arithmetic::arithmetic_fits(ctx.config, ctx.model) else {
        return;
    };
    out.push(
        Diagnostic::error(
            SIZE_OVERFLOW,
            format!(
                "{} overflows 64-bit arithmetic (beyond 2^62)",
                overflow.what
            ),
        )
        .with_key(overflow.key)
        .with_primary(ctx.origin(overflow.key), "one factor of it")
        .with_help("give the sizes the run really has"),
    );
}
