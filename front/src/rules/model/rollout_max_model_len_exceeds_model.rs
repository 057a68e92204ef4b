//! ## What it checks
//! Needs the model's `config.json` with `max_position_embeddings`.
//! `actor_rollout_ref.rollout.max_model_len`, when set, must not exceed it.
//!
//! ## Why
//! The rollout server refuses a context longer than the model's positions
//! ("max_model_len (…) should be less than or equal to max_position_embeddings (…)") when it
//! starts; verl 0.7.0 silently replaced the value by `max_position_embeddings` instead.
//!
//! ## Example
//! ```yaml
//! # the model has max_position_embeddings: 32768
//! actor_rollout_ref:
//!   rollout:
//!     max_model_len: 65536
//! ```
//!
//! ## Fix
//! Lower `max_model_len` to the model's limit, or leave it null to use that limit.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V203");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let Some(limit) = ctx.model.and_then(|m| m.max_position_embeddings) else {
        return;
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let Some(len) = ctx.config.actor_rollout_ref.rollout.max_model_len else {
        return;
    };
    if len <= limit {
        return;
    }
    let key = "actor_rollout_ref.rollout.max_model_len";
    out.push(
        Diagnostic::error(CODE, format!("rollout max_model_len {len} is longer than the model's max_position_embeddings {limit}"))
            .with_key(key)
            .with_primary(ctx.origin(key), format!("{len} tokens"))
            .with_note(format!("the model's config.json has max_position_embeddings = {limit}"))
            .with_help(format!("set `{key}` to at most {limit}, or to null to use the model's limit")),
    );
}
