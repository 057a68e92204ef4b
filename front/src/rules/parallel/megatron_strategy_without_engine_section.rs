//! ## What it checks
//! A role whose `strategy` is `megatron` in a config that has no `megatron` section for it:
//! the config was composed from the FSDP base (`ppo_trainer`), which defines only
//! `fsdp_config`.
//!
//! ## Why
//! verl picks its Megatron workers from the strategy and builds them from the role's
//! `megatron` section; without it they fail when the cluster starts (the FSDP engine
//! settings are not read at all).
//!
//! ## Example
//! ```yaml
//! # composed from ppo_trainer
//! actor_rollout_ref:
//!   actor:
//!     strategy: megatron
//! ```
//!
//! ## Fix
//! Compose from the Megatron base: `--config-name ppo_megatron_trainer`, or
//! `defaults: [ppo_megatron_trainer, _self_]` in your file.

use crate::config::Strategy;
use crate::diag::{Code, Diagnostic};
use crate::role::Role;
use crate::rules::RuleContext;
use crate::rules::facts::push_unique;

const CODE: Code = Code("V045");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    for role in Role::all(ctx.config) {
        if !role.runs || role.strategy != Strategy::Megatron || role.megatron.is_some() {
            continue;
        }
        let prefix = role.prefix;
        let key = format!("{prefix}.strategy");
        // The reference copies the actor's strategy by interpolation: one report per line.
        push_unique(
            out,
            Diagnostic::error(
                CODE,
                format!("`{key}` is megatron, but the config has no `{prefix}.megatron` section (it was composed from the FSDP base)"),
            )
            .with_key(key.clone())
            .with_primary(ctx.origin(&key), "megatron chosen here")
            .with_help("compose from the Megatron base: `--config-name ppo_megatron_trainer`, or `defaults: [ppo_megatron_trainer, _self_]`"),
        );
    }
}
