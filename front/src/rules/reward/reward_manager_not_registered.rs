//! ## What it checks
//! With `reward_manager.source: register`, `reward_manager.name` must be one of verl's
//! registered reward managers: `naive`, `batch`, `dapo`, `prime` where the tree has the top-level
//! `reward_manager` (verl 0.7.0, and verl's main branch before 0.7.1's reward section); the
//! reward loop's `naive`, `dapo`, `gdpo`, `remote` where the settings are under
//! `reward.reward_manager` (0.7.1 on). (The name copies the
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
use crate::reward::Rewards;
use crate::rules::RuleContext;

const CODE: Code = Code("V032");
/// verl 0.7.0's reward managers (`verl.workers.reward_manager`).
const REGISTERED_0_7_0: &[&str] = &["naive", "batch", "dapo", "prime"];
/// The reward loop's managers, which verl loads from 0.7.1 on
/// (`verl.experimental.reward_loop.reward_manager`).
const REWARD_LOOP: &[&str] = &["naive", "dapo", "gdpo", "remote"];

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let m = Rewards::of(ctx.config, ctx.root).manager;
    // The registry follows the layout verl loads the manager from: the top-level
    // `reward_manager` is read by `verl.workers.reward_manager` (0.7.0, and verl's main branch
    // until the reward section arrived), `reward.reward_manager` by the reward loop.
    let registered = if m.prefix == "reward_manager" {
        REGISTERED_0_7_0
    } else {
        REWARD_LOOP
    };
    match m.source {
        RewardSource::Register => {
            if registered.contains(&m.name) {
                return;
            }
            let key = m.name_key;
            let help = match did_you_mean(m.name, registered.iter().copied()) {
                Some(s) => format!("did you mean `{s}`?"),
                None => format!(
                    "use one of {}, or `{}.source=importlib` with `{}.module.path`",
                    registered.join(", "),
                    m.prefix,
                    m.prefix
                ),
            };
            out.push(
                Diagnostic::error(
                    CODE,
                    format!(
                        "`{}` is not a registered reward manager (registered: {})",
                        m.name,
                        registered.join(", ")
                    ),
                )
                .with_key(key)
                .with_primary(ctx.origin(key), format!("`{}` set here", m.name))
                .with_help(help),
            );
        }
        RewardSource::Importlib => {
            if m.module_path.is_some() {
                return;
            }
            let key = format!("{}.module.path", m.prefix);
            let source = format!("{}.source", m.prefix);
            out.push(
                Diagnostic::error(CODE, format!("{source} is `importlib` but `{key}` is null"))
                    .with_key(key.clone())
                    .with_primary(ctx.origin(&key), "no module path")
                    .with_secondary(ctx.origin(&source), "importlib chosen here")
                    .with_help(format!(
                        "set `{key}` to the Python file that defines the class named in `{}.name`",
                        m.prefix
                    )),
            );
        }
    }
}
