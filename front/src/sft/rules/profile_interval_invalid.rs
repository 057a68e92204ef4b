//! ## What it checks
//! That `trainer.profile_interval` is two steps `[start, end]` with `end >= start`, and both
//! negative when `start` is (profiling off).
//!
//! ## Why
//! verl's SFT trainer asserts all three when it starts.
//!
//! ## Example
//! ```yaml
//! trainer:
//!   profile_interval: [10, 5]
//! ```
//!
//! ## Fix
//! Give `[first step, last step]`, or `[-1, -1]` to profile nothing.

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let key = "trainer.profile_interval";
    if ctx
        .root
        .get_path(&["trainer", "profile_interval"])
        .is_none()
    {
        return;
    }
    let why = match ctx.config.profile_interval.as_slice() {
        [start, end] if end < start => "the end is before the start",
        [start, end] if *start < 0 && *end >= 0 => "a negative start (off) needs a negative end",
        [_, _] => return,
        _ => "it is two steps, [start, end]",
    };
    out.push(
        Diagnostic::error(
            Code("F013"),
            format!("trainer.profile_interval is invalid: {why}"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "verl asserts it at start-up"),
    );
}
