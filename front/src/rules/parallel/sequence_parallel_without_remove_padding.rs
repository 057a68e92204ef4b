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
use crate::role::Role;
use crate::rules::RuleContext;

const CODE: Code = Code("V020");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    for (role, key, who) in [
        (
            Role::actor(c),
            "actor_rollout_ref.model.use_remove_padding",
            "actor and reference policy",
        ),
        (Role::critic(c), "critic.model.use_remove_padding", "critic"),
    ] {
        if role.runs && role.is_fsdp() && role.sp > 1 && !role.remove_padding {
            push(ctx, out, key, role.sp_key, role.sp, who);
        }
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
