//! ## What it checks
//! That `optim.lr_scheduler_type` (the FSDP engine's optimizer) is `constant` or `cosine`.
//!
//! ## Why
//! verl's optimizer config asserts one of the two when the trainer starts.
//!
//! ## Example
//! ```yaml
//! optim:
//!   lr_scheduler_type: linear
//! ```
//!
//! ## Fix
//! Use `constant` (the default, with optional warm-up) or `cosine`.

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    if c.engine.is_megatron() {
        return;
    }
    let Some(kind) = &c.lr_scheduler_type else {
        return;
    };
    if matches!(kind.as_str(), "constant" | "cosine") {
        return;
    }
    let key = "optim.lr_scheduler_type";
    out.push(
        Diagnostic::error(
            Code("F012"),
            format!("optim.lr_scheduler_type `{kind}` is not constant or cosine"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "verl asserts one of the two"),
    );
}
