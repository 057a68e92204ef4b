//! ## What it checks
//! On verl 0.7.1 (the release that added the `model_engine` group), an actor or a running
//! critic on the `veomni` or `torchtitan` engine while `trainer.use_legacy_worker_impl` is not
//! `disable`.
//!
//! ## Why
//! verl 0.7.1 builds those engines only in its engine workers: with the legacy workers chosen
//! (`auto`, its default, or `enable`) its trainer raises "veomni does not support legacy
//! worker implementation" for the actor and "Invalid use_legacy_worker_impl for veomni" for
//! the critic when it starts. verl 0.8 removed the legacy workers and the key.
//!
//! ## Example
//! ```yaml
//! # verl 0.7.1's tree, composed with model_engine=veomni
//! trainer:
//!   use_legacy_worker_impl: auto
//! ```
//!
//! ## Fix
//! Set `trainer.use_legacy_worker_impl=disable`.

use crate::config::LegacyWorkerImpl;
use crate::diag::{Code, Diagnostic};
use crate::role::critic_runs;
use crate::rules::RuleContext;

const CODE: Code = Code("V061");

/// The engines verl 0.7.1 runs only in its engine workers.
const ENGINE_ONLY: [&str; 2] = ["veomni", "torchtitan"];

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    // 0.7.0 has neither engine (its schema refuses the names); 0.8 has no legacy workers.
    if ctx.release.map(|(a, b, _)| (a, b)) != Some((0, 7)) {
        return;
    }
    let c = ctx.config;
    if c.trainer.use_legacy_worker_impl == LegacyWorkerImpl::Disable {
        return;
    }
    let mut roles = vec!["actor_rollout_ref.actor"];
    if critic_runs(c) {
        roles.push("critic");
    }
    // The check's copy holds a VeOmni role as the FSDP one it equals: the engine is read
    // from the tree as written.
    let engine_of = |role: &str| {
        let key = format!("{role}.strategy");
        ctx.node(&key)
            .and_then(|n| n.as_str())
            .filter(|s| ENGINE_ONLY.contains(s))
            .map(|s| (key, s.to_owned()))
    };
    let Some((strategy_key, engine)) = roles.iter().find_map(|r| engine_of(r)) else {
        return;
    };
    let key = "trainer.use_legacy_worker_impl";
    let value = match c.trainer.use_legacy_worker_impl {
        LegacyWorkerImpl::Enable => "enable",
        _ => "auto",
    };
    out.push(
        Diagnostic::error(
            CODE,
            format!("verl 0.7.1 runs the `{engine}` engine only in its engine workers, but `{key}` is `{value}` (the legacy workers): its trainer raises when it starts"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "the legacy workers chosen here")
        .with_secondary(ctx.origin(&strategy_key), format!("`{engine}` chosen here"))
        .with_help(format!("set `{key}=disable` (verl 0.8 made the engine workers the only ones)")),
    );
}
