//! ## What it checks
//! That `optim.lr_scheduler_type` (the FSDP engine's optimizer) is `constant` or `cosine`; in
//! verl 0.7.0's legacy config, that `optim.lr_scheduler` is `cosine` or `wsd`.
//!
//! ## Why
//! verl's optimizer config asserts one of the two when the trainer starts; the legacy trainer
//! raises ValueError for another scheduler name when it builds the model.
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
    // Megatron's and AutoModel's optimizers take Megatron's decay styles.
    if c.engine.is_megatron() || c.engine.strategy == "automodel" {
        return;
    }
    let Some(kind) = &c.lr_scheduler_type else {
        return;
    };
    let known: &[&str] = if c.is_legacy() {
        &["cosine", "wsd"]
    } else {
        &["constant", "cosine"]
    };
    if known.contains(&kind.as_str()) {
        return;
    }
    let key = c.key("optim.lr_scheduler_type");
    out.push(
        Diagnostic::error(
            Code("F012"),
            format!("{key} `{kind}` is not {}", known.join(" or ")),
        )
        .with_key(key)
        .with_primary(
            ctx.origin("optim.lr_scheduler_type"),
            "verl accepts one of the two",
        ),
    );
}
