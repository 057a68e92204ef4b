//! ## What it checks
//! With dynamic batching (`data.use_dynamic_bsz: true`), that a rank's token budget
//! (`data.max_token_len_per_gpu × Ulysses size`) holds a sample of `data.max_length` tokens.
//!
//! ## Why
//! verl packs each rank's samples into micro-batches of at most the budget and asserts that
//! the longest sample fits: a sample longer than the budget fails the step it is drawn in,
//! which may be hours into the run.
//!
//! ## Example
//! ```yaml
//! data:
//!   max_length: 4096
//!   max_token_len_per_gpu: 2048
//! ```
//!
//! ## Fix
//! Raise `data.max_token_len_per_gpu` to at least `data.max_length`.

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    if !c.use_dynamic_bsz {
        return;
    }
    let budget = c.token_budget();
    if budget >= c.max_length {
        return;
    }
    let key = "data.max_token_len_per_gpu";
    out.push(
        Diagnostic::warning(
            Code("F010"),
            format!(
                "a rank's token budget ({budget}) is below data.max_length ({}): a sample longer than the budget fails its step",
                c.max_length
            ),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "the token budget")
        .with_secondary(ctx.origin("data.max_length"), "the longest sample")
        .with_help(format!("raise it to at least {}", c.max_length)),
    );
}
