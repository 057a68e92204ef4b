//! ## What it checks
//! That every entry of `trainer.logger` is a backend verl's tracking knows: console, file,
//! wandb, mlflow, swanlab, vemlp_wandb, tensorboard, clearml, trackio (and rl_insight from 0.9).
//!
//! ## Why
//! verl's tracking asserts the names when the trainer starts, on every rank, after the model
//! is loaded.
//!
//! ## Example
//! ```yaml
//! trainer:
//!   logger: [console, wandbb]
//! ```
//!
//! ## Fix
//! Spell the backend as verl does.

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

const KNOWN: &[&str] = &[
    "console",
    "file",
    "wandb",
    "mlflow",
    "swanlab",
    "vemlp_wandb",
    "tensorboard",
    "clearml",
    "trackio",
    // Accepted with a deprecation warning.
    "tracking",
];

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    let key = "trainer.logger";
    for name in &ctx.config.logger {
        let known =
            KNOWN.contains(&name.as_str()) || (name == "rl_insight" && ctx.at_least((0, 9)));
        if known {
            continue;
        }
        out.push(
            Diagnostic::error(
                Code("F011"),
                format!("trainer.logger `{name}` is not a backend of verl's tracking"),
            )
            .with_key(key)
            .with_primary(ctx.origin(key), "verl asserts the names at start-up")
            .with_help(format!("one of {}", KNOWN[..KNOWN.len() - 1].join(", "))),
        );
    }
}
