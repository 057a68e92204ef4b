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
use crate::rules::RuleContext;
use crate::rules::facts::{critic_runs, push_unique, reference_runs};

const CODE: Code = Code("V045");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let a = &c.actor_rollout_ref.actor;
    let r = &c.actor_rollout_ref.reference;
    let cr = &c.critic;
    let roles = [
        (
            "actor_rollout_ref.actor",
            true,
            a.strategy,
            a.megatron.is_some(),
        ),
        (
            "actor_rollout_ref.ref",
            reference_runs(c),
            r.strategy,
            r.megatron.is_some(),
        ),
        ("critic", critic_runs(c), cr.strategy, cr.megatron.is_some()),
    ];
    for (prefix, runs, strategy, has_section) in roles {
        if !runs || strategy != Strategy::Megatron || has_section {
            continue;
        }
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
