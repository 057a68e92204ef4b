//! ## What it checks
//! Values left as `???` (OmegaConf's "mandatory, no default") that verl will read:
//! `actor_rollout_ref.rollout.name` always, `actor_rollout_ref.actor.strategy` always,
//! `critic.strategy` when the critic runs, `reward_model.strategy` when the reward model is
//! enabled, and `reward_model.rollout.name` when the reward model is enabled and runs in the
//! reward loop. Any other `???` inside the actor/rollout/reference/model nodes (which verl
//! turns into dataclasses), the critic (when it runs) or the reward model (when enabled) is an
//! error too; elsewhere it is a warning, since verl fails only if it reads the key.
//!
//! ## Why
//! verl has no default for these; reading one raises `MissingMandatoryValue` at start-up.
//! The rollout engine in particular has had no default since verl 0.6.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   rollout:
//!     tensor_model_parallel_size: 2
//!     # name is never given
//! ```
//!
//! ## Fix
//! Give the value, e.g. `actor_rollout_ref.rollout.name=vllm`.

use crate::diag::{Code, Diagnostic};
use crate::reward::Rewards;
use crate::rules::RuleContext;
use crate::rules::facts::critic_runs;

const CODE: Code = Code("V021");

const ENGINES: &str =
    "`vllm`, `sglang` or `trtllm` (verl's engines), or `verlc` (verlc's built-in engine)";
const STRATEGIES: &str = "`fsdp`, `fsdp2` or `megatron`";

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let rm = &c.reward_model;
    // The legacy reward model's keys matter in a 0.7.0 layout; `reward.reward_model`'s in 0.7.1+.
    let legacy_rm = rm.enable && c.reward.is_none();
    let loop_rm = c.reward.is_some() && Rewards::of(c, ctx.root).model.enabled();
    for key in ctx.missing {
        let (needed, choices) = match key.as_str() {
            "actor_rollout_ref.rollout.name" => (true, Some(ENGINES)),
            "actor_rollout_ref.actor.strategy" => (true, Some(STRATEGIES)),
            "critic.strategy" => (critic_runs(c), Some(STRATEGIES)),
            "reward_model.strategy" => (legacy_rm, Some(STRATEGIES)),
            "reward_model.rollout.name" => (
                legacy_rm && rm.use_reward_loop,
                Some("`vllm`, `sglang` or `trtllm`"),
            ),
            "reward.reward_model.rollout.name" => (loop_rm, Some("`vllm`, `sglang` or `trtllm`")),
            k if k.starts_with("actor_rollout_ref.") => (true, None),
            k if k.starts_with("critic.") => (critic_runs(c), None),
            k if k.starts_with("reward_model.") => (legacy_rm, None),
            k if k.starts_with("reward.reward_model.") => (loop_rm, None),
            _ => (false, None),
        };
        let known = choices.is_some()
            || key.starts_with("actor_rollout_ref.")
            || key.starts_with("critic.")
            || key.starts_with("reward_model.")
            || key.starts_with("reward.reward_model.");
        if !needed && known {
            continue; // verl never reads it in this configuration
        }
        let help = match choices {
            Some(choices) => format!("set `{key}` to {choices}"),
            None => format!("give `{key}` a value (on the command line: `{key}=…`)"),
        };
        let d = if needed {
            Diagnostic::error(
                CODE,
                format!("`{key}` is mandatory and was never given (`???`)"),
            )
        } else {
            Diagnostic::warning(
                CODE,
                format!("`{key}` is still `???`; verl fails if anything reads it"),
            )
        };
        out.push(
            d.with_key(key.clone())
                .with_primary(ctx.origin(key), "still `???` here")
                .with_help(help),
        );
    }
}
