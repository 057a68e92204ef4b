//! ## What it checks
//! Tiled MLP turned on for a role that uses FSDP1 (`strategy: fsdp`) in verl's legacy FSDP
//! workers: `actor_rollout_ref.model.tiled_mlp.enabled` with the actor's strategy (also for
//! the reference policy, whose `ref.tiled_mlp` defaults to the model's), and
//! `critic.model.tiled_mlp.enabled` with the critic's strategy when the critic runs.
//!
//! ## Why
//! Tiled MLP only computes correct gradients under FSDP2; the legacy worker refuses it when it
//! builds the model ("TiledMLP requires FSDP2. Set `actor_rollout_ref.actor.strategy=fsdp2`.").
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   model:
//!     tiled_mlp:
//!       enabled: true
//!   actor:
//!     strategy: fsdp
//! ```
//!
//! ## Fix
//! Switch the role to `strategy: fsdp2`, or turn tiled MLP off.

use crate::config::Strategy;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{critic_runs, new_engine, reference_runs};

const CODE: Code = Code("V026");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    if new_engine(c) {
        return;
    }
    let arr = &c.actor_rollout_ref;
    if arr.actor.strategy == Strategy::Fsdp {
        let model_key = "actor_rollout_ref.model.tiled_mlp.enabled";
        if arr.model.tiled_mlp.enabled {
            push(ctx, out, model_key, "actor_rollout_ref.actor.strategy");
        }
        // The reference policy uses its own `tiled_mlp` when given, else the model's.
        if reference_runs(c)
            && let Some(t) = &arr.reference.tiled_mlp
            && t.enabled
        {
            push(
                ctx,
                out,
                "actor_rollout_ref.ref.tiled_mlp.enabled",
                "actor_rollout_ref.actor.strategy",
            );
        }
    }
    let cr = &c.critic;
    if critic_runs(c)
        && cr.strategy == Strategy::Fsdp
        && cr.model.tiled_mlp.as_ref().is_some_and(|t| t.enabled)
    {
        push(
            ctx,
            out,
            "critic.model.tiled_mlp.enabled",
            "critic.strategy",
        );
    }
}

fn push(ctx: &RuleContext, out: &mut Vec<Diagnostic>, key: &str, strategy_key: &str) {
    out.push(
        Diagnostic::error(
            CODE,
            format!("tiled MLP (`{key}`) needs FSDP2, but `{strategy_key}` is `fsdp`"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "tiled MLP turned on here")
        .with_secondary(ctx.origin(strategy_key), "FSDP1 chosen here")
        .with_help(format!("set `{strategy_key}=fsdp2`, or `{key}=false`")),
    );
}
