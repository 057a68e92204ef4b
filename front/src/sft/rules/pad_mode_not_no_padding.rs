//! ## What it checks
//! That `data.pad_mode` is `no_padding`, the one mode verl's engine-based SFT trainer runs.
//!
//! verl 0.7.0's legacy trainer (`fsdp_sft_trainer`) is the other way round: it stacks padded
//! rows, so its multi-turn dataset's `data.pad_mode` (added with `+data.pad_mode`) must stay
//! `right`.
//!
//! ## Why
//! Its dataset also accepts `right`, but the FSDP engine asserts `no_padding` at the first
//! step and the Megatron engine raises NotImplementedError for anything else: the run fails
//! after the model is loaded. Values other than `right` and `no_padding` fail in the dataset.
//!
//! ## Example
//! ```yaml
//! data:
//!   pad_mode: right
//! ```
//!
//! ## Fix
//! Use `data.pad_mode: no_padding` (sequences are packed; nothing is lost).

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let mode = ctx.config.pad_mode.as_str();
    let key = "data.pad_mode";
    if ctx.config.is_legacy() {
        if mode != "right" {
            out.push(
                Diagnostic::error(
                    Code("F003"),
                    format!("data.pad_mode `{mode}` cannot be trained by the legacy trainer"),
                )
                .with_key(key)
                .with_primary(
                    ctx.origin(key),
                    "fsdp_sft_trainer stacks rows padded to data.max_length",
                )
                .with_help("remove it (the dataset's default is `right`)"),
            );
        }
        return;
    }
    if mode == "no_padding" {
        return;
    }
    let why = if mode == "right" {
        "verl's SFT engines train only packed sequences: `right` fails at the first step"
    } else {
        "verl's SFT dataset takes `right` or `no_padding`, and its engines train only `no_padding`"
    };
    out.push(
        Diagnostic::error(
            Code("F003"),
            format!("data.pad_mode `{mode}` cannot be trained"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), why)
        .with_help("use `no_padding`"),
    );
}
