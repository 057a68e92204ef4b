//! ## What it checks
//! That Ulysses sequence parallelism (`engine.ulysses_sequence_parallel_size` above 1) runs
//! with `model.use_remove_padding: true` on the FSDP engine.
//!
//! ## Why
//! Ulysses splits the packed sequence across ranks; verl's FSDP engine (0.8.0 on) raises a
//! ValueError at start-up without it, and earlier releases train on padded sequences that the
//! split does not handle.
//!
//! ## Example
//! ```yaml
//! model:
//!   use_remove_padding: false
//! engine:
//!   ulysses_sequence_parallel_size: 2
//! ```
//!
//! ## Fix
//! Set `model.use_remove_padding: true` (the default).

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    if c.engine.is_megatron() || c.engine.ulysses <= 1 || c.use_remove_padding {
        return;
    }
    out.push(
        Diagnostic::error(
            Code("F007"),
            format!(
                "Ulysses sequence parallelism ({}) needs {}",
                c.engine.ulysses,
                c.key("model.use_remove_padding")
            ),
        )
        .with_key(c.key("model.use_remove_padding"))
        .with_primary(ctx.origin("model.use_remove_padding"), "padding kept")
        .with_secondary(
            ctx.origin("engine.ulysses_sequence_parallel_size"),
            "sequences split across ranks",
        )
        .with_help(format!("set {}=true", c.key("model.use_remove_padding"))),
    );
}
