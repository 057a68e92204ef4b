//! ## What it checks
//! With dynamic batching (`use_dynamic_bsz`), every role's per-GPU token budget times its
//! sequence split (Ulysses sequence parallel for FSDP, context parallel for Megatron) must hold
//! the longest possible sequence, `data.max_prompt_length + data.max_response_length`. Checked
//! for the actor's update, the old-log-prob and reference passes, the critic and the reward
//! model, each when it runs with dynamic batching.
//!
//! ## Why
//! Dynamic batching packs whole sequences into micro-batches of at most the budget. verl
//! fails as soon as one sequence is longer ("max_token_len must be greater than the sequence
//! length. Got max_token_len=… and max_seq_len=…"), typically several steps into a run, when a
//! long response first appears.
//!
//! ## Example
//! ```yaml
//! data:
//!   max_prompt_length: 2048
//!   max_response_length: 8192
//! actor_rollout_ref:
//!   actor:
//!     use_dynamic_bsz: true
//!     ppo_max_token_len_per_gpu: 8192   # < 10240
//! ```
//!
//! ## Fix
//! Raise the token budget to at least the maximum sequence length (two to three times it is
//! common), or raise the sequence-parallel size.

use crate::diag::{Code, Diagnostic};
use crate::role::Role;
use crate::rules::RuleContext;
use crate::rules::facts::{critic_runs, is_fsdp, reference_runs};
use crate::source::Origin;

const CODE: Code = Code("V012");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let seq = c
        .data
        .max_prompt_length
        .saturating_add(c.data.max_response_length);
    let a = &c.actor_rollout_ref.actor;
    let [actor, reference, critic] = Role::all(c).map(|r| r.sequence_split());
    let (actor_split, ref_split, critic_split) = (actor, reference, critic);
    let rm = &c.reward_model;
    let rm_split = if is_fsdp(rm.strategy) {
        rm.ulysses_sequence_parallel_size.unwrap_or(1)
    } else {
        rm.megatron.as_ref().map_or(1, |m| m.context_parallel_size)
    };

    let mut budgets: Vec<(&str, i64, i64)> = Vec::new();
    if a.use_dynamic_bsz {
        budgets.push((
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
            a.ppo_max_token_len_per_gpu,
            actor_split,
        ));
    }
    let r = &c.actor_rollout_ref.rollout;
    if r.log_prob_use_dynamic_bsz {
        budgets.push((
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
            r.log_prob_max_token_len_per_gpu,
            actor_split,
        ));
    }
    let rf = &c.actor_rollout_ref.reference;
    if reference_runs(c) && rf.log_prob_use_dynamic_bsz {
        budgets.push((
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
            rf.log_prob_max_token_len_per_gpu,
            ref_split,
        ));
    }
    if critic_runs(c) && c.critic.use_dynamic_bsz {
        budgets.push((
            "critic.ppo_max_token_len_per_gpu",
            c.critic.ppo_max_token_len_per_gpu,
            critic_split,
        ));
        budgets.push((
            "critic.forward_max_token_len_per_gpu",
            c.critic.forward_max_token_len_per_gpu,
            critic_split,
        ));
    }
    if rm.enable && c.reward.is_none() && rm.use_dynamic_bsz && !rm.use_reward_loop {
        budgets.push((
            "reward_model.forward_max_token_len_per_gpu",
            rm.forward_max_token_len_per_gpu,
            rm_split,
        ));
    }

    // Mirrored keys share one origin; report each written value (and split) once.
    let mut reported: Vec<(Option<Origin>, i64)> = Vec::new();
    for (key, per_gpu, split) in budgets {
        let split = split.max(1);
        let budget = per_gpu.saturating_mul(split);
        if budget >= seq {
            continue;
        }
        let origin = ctx.origin(key);
        if origin.is_some() && reported.contains(&(origin.clone(), split)) {
            continue;
        }
        reported.push((origin.clone(), split));
        let split_text = if split > 1 {
            format!(" × sequence split {split} = {budget}")
        } else {
            String::new()
        };
        let needed = seq.saturating_add(split - 1) / split;
        out.push(
            Diagnostic::error(
                CODE,
                format!(
                    "token budget `{key}` = {per_gpu}{split_text} cannot hold one sequence of up to {seq} tokens (max_prompt_length {} + max_response_length {})",
                    c.data.max_prompt_length, c.data.max_response_length
                ),
            )
            .with_key(key)
            .with_primary(origin, format!("{per_gpu} tokens per GPU"))
            .with_secondary(ctx.origin("data.max_prompt_length"), "prompt length set here")
            .with_secondary(ctx.origin("data.max_response_length"), "response length set here")
            .with_help(format!("set `{key}` to at least {needed} (two to three times that packs several sequences per micro-batch)")),
        );
    }
}
