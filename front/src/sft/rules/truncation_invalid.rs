//! ## What it checks
//! That `data.truncation` is `error`, `left` or `right`, and says that under
//! `pad_mode: no_padding` `left` keeps the start of a sample as `right` does.
//!
//! ## Why
//! verl's SFT dataset asserts one of the three values when it is built. Without padding it
//! always truncates on the right whatever `left` says, so a run meant to keep the end of long
//! conversations keeps their start.
//!
//! ## Example
//! ```yaml
//! data:
//!   truncation: left
//! ```
//!
//! ## Fix
//! Use `error` (fail on an over-long sample) or `right`.

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let key = "data.truncation";
    let t = ctx.config.truncation.as_str();
    match t {
        "error" | "right" => {}
        "left" if ctx.config.pad_mode == "no_padding" => out.push(
            Diagnostic::warning(
                Code("F004"),
                "data.truncation `left` truncates on the right under pad_mode no_padding",
            )
            .with_key(key)
            .with_primary(ctx.origin(key), "verl keeps the first max_length tokens")
            .with_help("say `right`, which is what runs, or `error` to find the long samples"),
        ),
        "left" => {}
        other => out.push(
            Diagnostic::error(
                Code("F004"),
                format!("data.truncation `{other}` is not error, left or right"),
            )
            .with_key(key)
            .with_primary(
                ctx.origin(key),
                "verl's SFT dataset asserts one of the three",
            ),
        ),
    }
}
