//! ## What it checks
//! Needs the model's `config.json` (`--model-config`, or a local `actor_rollout_ref.model.path`).
//! `num_attention_heads` must be a multiple of every degree that splits attention heads: the
//! Megatron actor's `tensor_model_parallel_size`, the rollout's
//! `tensor_model_parallel_size`, and the FSDP actor's Ulysses sequence-parallel size.
//!
//! ## Why
//! Each rank computes a whole number of heads. Megatron-core divides the heads over the
//! tensor-parallel ranks (`divide(num_attention_heads, world_size)` in its attention layer),
//! vLLM and SGLang check the same when they load the model, and verl's Ulysses patch asserts
//! `num_attention_heads % ulysses_sp_size == 0`. All of these fail only after the cluster and
//! model have started.
//!
//! ## Example
//! ```yaml
//! # Qwen2.5-7B: 28 attention heads
//! actor_rollout_ref:
//!   rollout:
//!     tensor_model_parallel_size: 8   # 28 is not a multiple of 8
//! ```
//!
//! ## Fix
//! Use a degree that divides the head count (1, 2, 4, 7, 14 or 28 above).

use crate::config::Strategy;
use crate::diag::{Code, Diagnostic};
use crate::role::Role;
use crate::rules::RuleContext;
use crate::rules::facts::{divisors, is_fsdp, n_gpus};

const CODE: Code = Code("V201");

/// Every degree that splits attention heads, with its key and what it is.
pub(super) fn head_splits(ctx: &RuleContext) -> Vec<(String, i64, &'static str, bool)> {
    let c = ctx.config;
    let a = &c.actor_rollout_ref.actor;
    let mut v = Vec::new();
    if a.strategy == Strategy::Megatron
        && let Some(m) = &a.megatron
    {
        // (key, degree, description, replicates kv heads when larger than their count)
        v.push((
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size".to_owned(),
            m.tensor_model_parallel_size,
            "Megatron tensor parallel",
            false,
        ));
    }
    v.push((
        "actor_rollout_ref.rollout.tensor_model_parallel_size".to_owned(),
        c.actor_rollout_ref.rollout.tensor_model_parallel_size,
        "rollout tensor parallel",
        true,
    ));
    if is_fsdp(a.strategy) {
        let actor = Role::actor(c);
        v.push((
            actor.sp_key.to_owned(),
            actor.sp,
            "Ulysses sequence parallel",
            true,
        ));
    }
    v.retain(|(_, size, _, _)| *size > 1);
    v
}

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let Some(model) = ctx.model else { return };
    let heads = i64::try_from(model.num_attention_heads).unwrap_or(i64::MAX);
    if heads <= 0 {
        return;
    }
    for (key, size, what, _) in head_splits(ctx) {
        if heads % size == 0 {
            continue;
        }
        let suggestion = pick(&divisors(heads), size, n_gpus(ctx.config));
        out.push(
            Diagnostic::error(
                CODE,
                format!("{what} size {size} does not divide the model's {heads} attention heads"),
            )
            .with_key(key.clone())
            .with_primary(ctx.origin(&key), format!("{what} {size}"))
            .with_note(format!(
                "the model's config.json has num_attention_heads = {heads}"
            ))
            .with_help(format!(
                "set `{key}` to a divisor of {heads}, e.g. {suggestion}"
            )),
        );
    }
}

/// The candidate closest to `size`, preferring those that also divide the GPU count (a
/// parallel degree has to).
pub(super) fn pick(candidates: &[i64], size: i64, gpus: i64) -> i64 {
    let closest = |it: &mut dyn Iterator<Item = i64>| it.min_by_key(|d| ((d - size).abs(), *d));
    closest(
        &mut candidates
            .iter()
            .copied()
            .filter(|d| gpus > 0 && gpus % d == 0),
    )
    .or_else(|| closest(&mut candidates.iter().copied()))
    .unwrap_or(1)
}
