//! ## What it checks
//! With fixed-size micro-batches, `ppo_mini_batch_size` of the actor (and of the critic, when
//! it runs) must not be larger than `data.train_batch_size`. Both count prompts.
//!
//! ## Why
//! A PPO mini-batch is a slice of one step's batch; verl rejects a mini-batch larger than the
//! batch in `ActorConfig.validate` / `CriticConfig.validate` ("train_batch_size (…) must be >=
//! actor.ppo_mini_batch_size (…)").
//!
//! ## Example
//! ```yaml
//! data:
//!   train_batch_size: 128
//! actor_rollout_ref:
//!   actor:
//!     ppo_mini_batch_size: 256   # larger than the batch
//! ```
//!
//! ## Fix
//! Lower `ppo_mini_batch_size` to at most `train_batch_size` (usually a divisor of it), or
//! raise `train_batch_size`.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{critic_runs, nearest_divisor};

const CODE: Code = Code("V002");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let tbs = c.data.train_batch_size;
    let actor = &c.actor_rollout_ref.actor;
    let actor_key = "actor_rollout_ref.actor.ppo_mini_batch_size";
    if !actor.use_dynamic_bsz && tbs < actor.ppo_mini_batch_size {
        out.push(diagnostic(ctx, actor_key, actor.ppo_mini_batch_size, tbs));
    }
    if !critic_runs(c) || c.critic.use_dynamic_bsz || tbs >= c.critic.ppo_mini_batch_size {
        return;
    }
    // The critic mirrors the actor's value by default: one report for one mistake.
    let critic_key = "critic.ppo_mini_batch_size";
    let mirrored = ctx.origin(critic_key) == ctx.origin(actor_key)
        && c.critic.ppo_mini_batch_size == actor.ppo_mini_batch_size;
    if mirrored && !actor.use_dynamic_bsz {
        return;
    }
    out.push(diagnostic(
        ctx,
        critic_key,
        c.critic.ppo_mini_batch_size,
        tbs,
    ));
}

fn diagnostic(ctx: &RuleContext, key: &str, mini: i64, tbs: i64) -> Diagnostic {
    let suggestion = nearest_divisor(tbs, mini).unwrap_or(tbs);
    Diagnostic::error(
        CODE,
        format!("`{key}` is {mini} prompts, more than the {tbs} prompts of one step (data.train_batch_size)"),
    )
    .with_key(key)
    .with_primary(ctx.origin(key), format!("mini-batch of {mini} prompts"))
    .with_secondary(ctx.origin("data.train_batch_size"), format!("step batch of {tbs} prompts"))
    .with_help(format!("set `{key}` to at most {tbs}, e.g. {suggestion} (a divisor of the batch)"))
}
