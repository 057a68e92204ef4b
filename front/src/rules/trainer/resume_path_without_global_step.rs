//! ## What it checks
//! With `trainer.resume_mode: resume_path`, `trainer.resume_from_path` must be a checkpoint
//! folder whose name ends in `global_step_<N>` (the step number is read from it).
//!
//! ## Why
//! verl asserts "resume ckpt must be str type" and "resume ckpt must specify the
//! global_steps", then parses the text after the last `global_step_` as an integer, so a
//! trailing slash or suffix fails too. This happens after every worker has loaded its model.
//!
//! ## Example
//! ```yaml
//! trainer:
//!   resume_mode: resume_path
//!   resume_from_path: checkpoints/my_run     # needs …/global_step_200
//! ```
//!
//! ## Fix
//! Point at one step's folder, e.g. `checkpoints/my_run/global_step_200`.

use crate::config::ResumeMode;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V035");
const KEY: &str = "trainer.resume_from_path";

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let t = &ctx.config.trainer;
    if t.resume_mode != ResumeMode::ResumePath {
        return;
    }
    let message = match t.resume_from_path.as_deref() {
        None => "resume_mode is `resume_path` but `trainer.resume_from_path` is null".to_owned(),
        Some(p) => match p.rsplit_once("global_step_") {
            None => format!("`{p}` does not name a `global_step_<N>` checkpoint folder"),
            Some((_, step)) if !is_python_int(step) => {
                format!(
                    "`{p}` must end in `global_step_<N>`; verl cannot read a step number from `{step}`"
                )
            }
            Some(_) => return,
        },
    };
    out.push(
        Diagnostic::error(CODE, message)
            .with_key(KEY)
            .with_primary(ctx.origin(KEY), "checkpoint path set here")
            .with_secondary(ctx.origin("trainer.resume_mode"), "resume_path chosen here")
            .with_help("point `trainer.resume_from_path` at one step's folder, e.g. `checkpoints/<project>/<experiment>/global_step_100`"),
    );
}

/// What Python's `int()` accepts: optional whitespace and sign, digits with single
/// underscores between them.
fn is_python_int(s: &str) -> bool {
    let s = s.trim();
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    !s.is_empty()
        && !s.starts_with('_')
        && !s.ends_with('_')
        && !s.contains("__")
        && s.chars().all(|ch| ch.is_ascii_digit() || ch == '_')
}
