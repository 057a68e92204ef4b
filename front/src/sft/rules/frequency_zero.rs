//! ## What it checks
//! That `trainer.save_freq` and `trainer.test_freq` are a step interval (`-1` or below: off) or
//! `after_each_epoch`, and not `0`.
//!
//! ## Why
//! verl's SFT trainer computes `step % freq` at every step: `0` raises ZeroDivisionError and
//! any other string a TypeError, at step 1, after the model is loaded.
//!
//! ## Example
//! ```yaml
//! trainer:
//!   save_freq: 0
//! ```
//!
//! ## Fix
//! Use `-1` to turn it off, a positive interval, or `after_each_epoch`.

use crate::diag::{Code, Diagnostic};
use crate::sft::config::Frequency;
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    for (key, f) in [
        ("trainer.save_freq", &ctx.config.save_freq),
        ("trainer.test_freq", &ctx.config.test_freq),
    ] {
        let why = match f {
            Frequency::Steps(0) => "`step % 0` fails at step 1",
            Frequency::Other(_) => "verl takes an integer or `after_each_epoch`",
            _ => continue,
        };
        out.push(
            Diagnostic::error(Code("F005"), format!("{key} cannot be {}", value(f)))
                .with_key(key)
                .with_primary(ctx.origin(key), why)
                .with_help("use -1 (off), a positive number of steps, or `after_each_epoch`"),
        );
    }
}

fn value(f: &Frequency) -> String {
    match f {
        Frequency::Steps(n) => n.to_string(),
        Frequency::AfterEachEpoch => "after_each_epoch".into(),
        Frequency::Other(s) => format!("`{s}`"),
    }
}
