//! ## What it checks
//! Ulysses sequence parallelism (a sequence-parallel size above 1) on an FSDP actor needs
//! `actor_rollout_ref.model.use_remove_padding: true`; on an FSDP critic (when it runs) it
//! needs `critic.model.use_remove_padding: true`.
//!
//! ## Why
//! Ulysses splits the packed, padding-free token stream across ranks. verl rejects the
//! combination when it builds the role's config ("When using sequence parallelism for
//! actor/ref policy, you must enable `use_remove_padding`.", and the same for the critic).
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   model:
//!     use_remove_padding: false
//!   actor:
//!     ulysses_sequence_parallel_size: 2
//! ```
//!
//! ## Fix
//! Turn `use_remove_padding` on (the model needs a flash-attention implementation), or use a
//! sequence-parallel size of 1.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{actor_sp, actor_sp_key, critic_runs, critic_sp, critic_sp_key, is_fsdp};

const CODE: Code = Code("V020");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    if is_fsdp(c.actor_rollout_ref.actor.strategy)
        && actor_sp(c) > 1
        && !c.actor_rollout_ref.model.use_remove_padding
    {
        push(
            ctx,
            out,
            "actor_rollout_ref.model.use_remove_padding",
            actor_sp_key(c),
            actor_sp(c),
            "actor and reference policy",
        );
    }
    let cr = &c.critic;
    if critic_runs(c)
        && is_fsdp(cr.strategy)
        && critic_sp(c) > 1
        && !cr.model.use_remove_padding.unwrap_or(false)
    {
        push(
            ctx,
            out,
            "critic.model.use_remove_padding",
            critic_sp_key(c),
            critic_sp(c),
            "critic",
        );
    }
}

fn push(
    ctx: &RuleContext,
    out: &mut Vec<Diagnostic>,
    key: &str,
    sp_key: &str,
    sp: i64,
    role: &str,
) {
    out.push(
        Diagnostic::error(
            CODE,
            format!("sequence parallelism ({sp}) for the {role} needs `{key}: true`"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "padding removal is off")
        .with_secondary(ctx.origin(sp_key), format!("sequence parallel {sp}"))
        .with_help(format!("set `{key}=true`, or `{sp_key}=1`")),
    );
}
