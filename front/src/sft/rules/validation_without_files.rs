//! ## What it checks
//! That a run which validates periodically (`trainer.test_freq` positive or `after_each_epoch`)
//! names validation data (`data.val_files`).
//!
//! verl 0.7.0's legacy trainer (`fsdp_sft_trainer`) needs them whatever `test_freq` says.
//!
//! ## Why
//! Without `val_files` verl's SFT trainer builds no validation loader, then iterates it at the
//! first validation step: a TypeError mid-run, after training and possibly hours of GPU time.
//! The legacy trainer builds its validation dataset at start-up (and validates after the last
//! step), so it fails before training.
//!
//! ## Example
//! ```yaml
//! data:
//!   val_files: null
//! trainer:
//!   test_freq: 100
//! ```
//!
//! ## Fix
//! Name the validation files, or set `trainer.test_freq: -1`.

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    if !c.val_files.is_empty() {
        return;
    }
    if c.is_legacy() {
        out.push(
            Diagnostic::error(
                Code("F006"),
                "data.val_files names no validation data; the legacy trainer loads it at start-up",
            )
            .with_key("data.val_files")
            .with_primary(ctx.origin("data.val_files"), "no validation files")
            .with_help("name the validation files (it validates after the last step)"),
        );
        return;
    }
    if !c.test_freq.enabled() {
        return;
    }
    out.push(
        Diagnostic::error(
            Code("F006"),
            "trainer.test_freq validates, but data.val_files names no validation data",
        )
        .with_key("trainer.test_freq")
        .with_primary(ctx.origin("trainer.test_freq"), "validates periodically")
        .with_secondary(ctx.origin("data.val_files"), "no validation files")
        .with_help("name data.val_files, or set trainer.test_freq=-1"),
    );
}
