//! ## What it checks
//! That `trainer.resume_mode` is `auto`, `disable` or `resume_path`, and that `resume_path`
//! (or `auto` with a path) names a `global_step_N` checkpoint directory.
//!
//! ## Why
//! verl's checkpoint handler raises on any other mode, and asserts that the path it resumes
//! from contains `global_step_` (it reads the step from the name) before training starts.
//!
//! ## Example
//! ```yaml
//! trainer:
//!   resume_mode: resume_path
//!   resume_from_path: null
//! ```
//!
//! ## Fix
//! Name the checkpoint directory (`.../global_step_500`), or use `auto`.

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let key = "trainer.resume_mode";
    match c.resume_mode.as_str() {
        "auto" | "disable" | "resume_path" => {}
        other => {
            out.push(
                Diagnostic::error(
                    Code("F009"),
                    format!("trainer.resume_mode `{other}` is not auto, disable or resume_path"),
                )
                .with_key(key)
                .with_primary(ctx.origin(key), "verl raises on it"),
            );
            return;
        }
    }
    let path_key = "trainer.resume_from_path";
    match (&c.resume_from_path, c.resume_mode.as_str()) {
        (None, "resume_path") => out.push(
            Diagnostic::error(
                Code("F009"),
                "trainer.resume_mode resume_path needs trainer.resume_from_path",
            )
            .with_key(path_key)
            .with_primary(ctx.origin(key), "resumes from a path")
            .with_help("name the checkpoint directory (.../global_step_N)"),
        ),
        (Some(p), "resume_path" | "auto") if !p.contains("global_step_") => out.push(
            Diagnostic::error(
                Code("F009"),
                format!("trainer.resume_from_path `{p}` is not a global_step_N directory"),
            )
            .with_key(path_key)
            .with_primary(ctx.origin(path_key), "verl reads the step from this name")
            .with_help("point at the step's directory, e.g. .../global_step_500"),
        ),
        _ => {}
    }
}
