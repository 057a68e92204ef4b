//! ## What it checks
//! With `reward_manager.source: register`, `reward_manager.name` must be one of verl's
//! registered reward managers: `naive`, `batch`, `dapo`, `prime`. (The name copies the
//! deprecated `reward_model.reward_manager` by default.) With `source: importlib`,
//! `reward_manager.module.path` must name the Python file.
//!
//! ## Why
//! verl loads the reward manager when the trainer starts (`load_reward_manager`): an unknown
//! name raises "Unknown reward manager: …", and an import without a path raises "Module path
//! is required when reward_manager_cfg.source='importlib'…".
//!
//! ## Example
//! ```yaml
//! reward_manager:
//!   name: dapo_v2
//! ```
//!
//! ## Fix
//! Use a registered name, or `source: importlib` with `module.path` and the class name in
//! `name`.

use crate::config::RewardSource;
use crate::diag::{Code, Diagnostic, did_you_mean};
use crate::rules::RuleContext;

const CODE: Code = Code("V032");
const REGISTERED: &[&str] = &["naive", "batch", "dapo", "prime"];

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let rm = &ctx.config.reward_manager;
    match rm.source {
        RewardSource::Register => {
            if REGISTERED.contains(&rm.name.as_str()) {
                return;
            }
            let key = "reward_manager.name";
            let help = match did_you_mean(&rm.name, REGISTERED.iter().copied()) {
                Some(s) => format!("did you mean `{s}`?"),
                None => format!(
                    "use one of {}, or `reward_manager.source=importlib` with `reward_manager.module.path`",
                    REGISTERED.join(", ")
                ),
            };
            out.push(
                Diagnostic::error(
                    CODE,
                    format!(
                        "`{}` is not a registered reward manager (registered: {})",
                        rm.name,
                        REGISTERED.join(", ")
                    ),
                )
                .with_key(key)
                .with_primary(ctx.origin(key), format!("`{}` set here", rm.name))
                .with_help(help),
            );
        }
        RewardSource::Importlib => {
            if rm.module.path.is_some() {
                return;
            }
            let key = "reward_manager.module.path";
            out.push(
                Diagnostic::error(CODE, "reward_manager.source is `importlib` but `reward_manager.module.path` is null")
                    .with_key(key)
                    .with_primary(ctx.origin(key), "no module path")
                    .with_secondary(ctx.origin("reward_manager.source"), "importlib chosen here")
                    .with_help("set `reward_manager.module.path` to the Python file that defines the class named in `reward_manager.name`"),
            );
        }
    }
}
