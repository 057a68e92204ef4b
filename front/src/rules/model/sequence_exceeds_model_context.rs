//! ## What it checks
//! Needs the rollout context length: `actor_rollout_ref.rollout.max_model_len`, or the model's
//! `max_position_embeddings` when that is null. Warns when `rollout.prompt_length +
//! rollout.response_length` (by default `data.max_prompt_length + data.max_response_length`)
//! does not fit in it.
//!
//! ## Why
//! The rollout server caps each request's new tokens at the context left after the prompt, so
//! responses are cut short without notice, and a prompt longer than the context fails
//! ("Prompt length (…) exceeds the model's maximum context length (…)").
//!
//! ## Example
//! ```yaml
//! # the model has max_position_embeddings: 4096
//! data:
//!   max_prompt_length: 1024
//!   max_response_length: 4096
//! ```
//!
//! ## Fix
//! Shorten the prompt or response length, or use a model (or `max_model_len`) with a longer
//! context.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V204");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let r = &ctx.config.actor_rollout_ref.rollout;
    let model_limit = ctx
        .model
        .and_then(|m| m.max_position_embeddings)
        .map(|l| i64::try_from(l).unwrap_or(i64::MAX));
    let (context, source) = match (r.max_model_len, model_limit) {
        (Some(len), _) => (len, "rollout.max_model_len"),
        (None, Some(limit)) => (limit, "the model's max_position_embeddings"),
        (None, None) => return,
    };
    let total = r.prompt_length.saturating_add(r.response_length);
    if total <= context {
        return;
    }
    let key = "actor_rollout_ref.rollout.response_length";
    let fits = (context - r.prompt_length).max(0);
    let mut d = Diagnostic::warning(
        CODE,
        format!(
            "prompt {} + response {} = {total} tokens exceed the rollout context of {context} ({source})",
            r.prompt_length, r.response_length
        ),
    )
    .with_key(key)
    .with_primary(ctx.origin(key), format!("{} response tokens", r.response_length))
    .with_secondary(ctx.origin("actor_rollout_ref.rollout.prompt_length"), format!("{} prompt tokens", r.prompt_length));
    if r.max_model_len.is_some() {
        d = d.with_secondary(
            ctx.origin("actor_rollout_ref.rollout.max_model_len"),
            format!("context of {context}"),
        );
    }
    out.push(
        d.with_note("responses are cut at the end of the context, and longer prompts fail")
            .with_help(format!(
                "lower data.max_response_length to at most {fits}, or the prompt length"
            )),
    );
}
