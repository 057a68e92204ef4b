//! ## What it checks
//! A Megatron actor with `actor.ulysses_sequence_parallel_size` above 1.
//!
//! ## Why
//! Ulysses sequence parallelism belongs to verl's FSDP workers. verl's Megatron actor
//! validates its config when it starts and asserts that the Ulysses degree is 1 (Megatron has
//! its own `megatron.sequence_parallel` and `context_parallel_size`).
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     strategy: megatron
//!     ulysses_sequence_parallel_size: 2
//! ```
//!
//! ## Fix
//! Set it to 1 and use Megatron's own `megatron.context_parallel_size` (long sequences) or
//! `megatron.sequence_parallel` (with tensor parallelism) instead.

use crate::config::Strategy;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V047");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let a = &ctx.config.actor_rollout_ref.actor;
    let sp = a.ulysses_sequence_parallel_size.unwrap_or(1);
    if a.strategy != Strategy::Megatron || sp <= 1 {
        return;
    }
    let key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size";
    out.push(
        Diagnostic::error(
            CODE,
            format!("the Megatron actor does not support Ulysses sequence parallelism, but `{key}` is {sp}"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), format!("Ulysses degree {sp}"))
        .with_secondary(ctx.origin("actor_rollout_ref.actor.strategy"), "megatron chosen here")
        .with_help("set it to 1; Megatron splits sequences with `megatron.context_parallel_size` or `megatron.sequence_parallel`"),
    );
}
