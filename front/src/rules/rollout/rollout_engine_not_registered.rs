//! ## What it checks
//! A rollout engine name that the schema accepts but verl cannot run: `hf` (Hugging Face
//! `generate`), for `actor_rollout_ref.rollout.name` and, when the reward model is enabled,
//! `reward_model.rollout.name`.
//!
//! ## Why
//! verl's rollout registry holds only vLLM, SGLang and TensorRT-LLM in async mode; `hf` is
//! still mentioned in comments but looking it up fails ("Rollout hf with mode async not
//! found") once the workers start.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   rollout:
//!     name: hf
//! ```
//!
//! ## Fix
//! Use `vllm` or `sglang` (or `verlc`, verlc's built-in engine).

use crate::config::RolloutName;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V023");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    if c.actor_rollout_ref.rollout.name == RolloutName::Hf {
        push(ctx, out, "actor_rollout_ref.rollout.name");
    }
    if c.reward_model.enable
        && c.reward.is_none()
        && c.reward_model.rollout.name == Some(RolloutName::Hf)
    {
        push(ctx, out, "reward_model.rollout.name");
    }
}

fn push(ctx: &RuleContext, out: &mut Vec<Diagnostic>, key: &str) {
    out.push(
        Diagnostic::error(
            CODE,
            "verl has no `hf` rollout engine any more (registered: vllm, sglang, trtllm)",
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "`hf` set here")
        .with_help(format!(
            "set `{key}` to `vllm` or `sglang` (or `verlc` for verlc's built-in engine)"
        )),
    );
}
