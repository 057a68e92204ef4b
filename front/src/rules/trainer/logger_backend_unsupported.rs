//! ## What it checks
//! Each entry of `trainer.logger`. `tracking` is verl's deprecated spelling of `wandb`. Other
//! backends verl knows but verlc's generated trainer does not implement (`wandb`, `mlflow`,
//! `swanlab`, `vemlp_wandb`, `clearml`, `trackio`) are reported too: verl accepts them,
//! verlc's trainer logs only to `console`, `file` and `tensorboard`.
//!
//! ## Why
//! verl emits a DeprecationWarning for `tracking`. With verlc's trainer, metrics meant for an
//! unavailable backend are not recorded, which is easy to miss until the run is over.
//!
//! ## Example
//! ```yaml
//! trainer:
//!   logger: [console, tracking]
//! ```
//!
//! ## Fix
//! Write `wandb` instead of `tracking`; for verlc's trainer, use `console`, `file` or
//! `tensorboard`.

use crate::config::{LoggerBackend, OneOrMany};
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V037");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    // verl's own default (`[console, wandb]`) is not the user's choice: say nothing.
    if !ctx.user_set("trainer.logger") {
        return;
    }
    let (items, listed) = match &ctx.config.trainer.logger {
        OneOrMany::One(b) => (vec![*b], false),
        OneOrMany::Many(v) => (v.clone(), true),
    };
    for (i, backend) in items.iter().enumerate() {
        let key = if listed {
            format!("trainer.logger.{i}")
        } else {
            "trainer.logger".to_owned()
        };
        let name = crate::config::common::spelling(&backend);
        let d = match backend {
            LoggerBackend::Console | LoggerBackend::File | LoggerBackend::Tensorboard => continue,
            LoggerBackend::Tracking => Diagnostic::warning(CODE, "logger `tracking` is deprecated in verl; it means `wandb`")
                .with_help("write `wandb` instead (verlc's trainer logs to console, file and tensorboard)"),
            _ => Diagnostic::warning(CODE, format!("logger `{name}` is valid for verl but not available in verlc's generated trainer"))
                .with_note("verlc's trainer logs to console, file (JSON lines) and tensorboard")
                .with_help(format!("keep `{name}` for runs under verl; for verlc's trainer use `console`, `file` or `tensorboard`")),
        };
        out.push(
            d.with_key("trainer.logger")
                .with_primary(ctx.origin(&key), format!("`{name}` listed here")),
        );
    }
}
