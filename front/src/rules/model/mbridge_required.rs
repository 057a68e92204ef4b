//! ## What it checks
//! Megatron roles with `megatron.use_mbridge: false` where verl cannot build the model
//! without mbridge: any Megatron actor under the engine workers
//! (`trainer.use_legacy_worker_impl: disable`), and, under the legacy workers, a Megatron
//! actor or critic (when it runs) whose `megatron.dtype` is `float16`.
//!
//! ## Why
//! verl's Megatron engine asserts "use_mbridge must be True" when it starts, and the legacy
//! Megatron workers assert "fp16 mode requires use_mbridge to be True" when they build the
//! model config; both happen after the cluster has started.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     strategy: megatron
//!     megatron:
//!       dtype: float16
//!       use_mbridge: false
//! ```
//!
//! ## Fix
//! Turn `use_mbridge` back on (the default), or use `bfloat16`.

use crate::config::{EngineDtype, MegatronEngineConfig, Strategy};
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{critic_runs, new_engine};

const CODE: Code = Code("V039");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let a = &c.actor_rollout_ref.actor;
    if a.strategy == Strategy::Megatron
        && let Some(m) = &a.megatron
    {
        push(
            ctx,
            out,
            "actor_rollout_ref.actor.megatron",
            m,
            new_engine(c),
        );
    }
    // verl runs a Megatron critic in the legacy worker whatever the setting.
    if critic_runs(c)
        && c.critic.strategy == Strategy::Megatron
        && let Some(m) = &c.critic.megatron
    {
        push(ctx, out, "critic.megatron", m, false);
    }
}

fn push(
    ctx: &RuleContext,
    out: &mut Vec<Diagnostic>,
    prefix: &str,
    m: &MegatronEngineConfig,
    engine: bool,
) {
    if m.use_mbridge {
        return;
    }
    let fp16 = m.dtype == EngineDtype::Float16;
    if !engine && !fp16 {
        return;
    }
    let key = format!("{prefix}.use_mbridge");
    let mut d = if engine {
        Diagnostic::error(CODE, format!("verl's Megatron engine workers build the model with mbridge only, but `{key}` is false"))
            .with_secondary(ctx.origin("trainer.use_legacy_worker_impl"), "engine workers chosen here")
    } else {
        Diagnostic::error(
            CODE,
            format!("float16 training under Megatron needs mbridge, but `{key}` is false"),
        )
        .with_secondary(
            ctx.origin(&format!("{prefix}.dtype")),
            "float16 chosen here",
        )
    };
    d = d
        .with_key(key.clone())
        .with_primary(ctx.origin(&key), "mbridge turned off here");
    let help = if engine {
        format!(
            "set `{key}=true`, or use the legacy workers (`trainer.use_legacy_worker_impl=auto`)"
        )
    } else {
        format!("set `{key}=true`, or `{prefix}.dtype=bfloat16`")
    };
    out.push(d.with_help(help));
}
