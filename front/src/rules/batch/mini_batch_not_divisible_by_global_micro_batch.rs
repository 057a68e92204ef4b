//! ## What it checks
//! When the deprecated global micro-batch size `ppo_micro_batch_size` is set (actor, or
//! critic when it runs) and dynamic batching is off, `ppo_mini_batch_size` must be a multiple
//! of it.
//!
//! ## Why
//! verl rejects the combination in `ActorConfig.validate` and `CriticConfig.__post_init__`
//! ("ppo_mini_batch_size (…) must be divisible by ppo_micro_batch_size (…)"); a mini-batch
//! has to be a whole number of micro-batches.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     ppo_mini_batch_size: 64
//!     ppo_micro_batch_size: 24   # 64 is not a multiple of 24
//! ```
//!
//! ## Fix
//! Prefer `ppo_micro_batch_size_per_gpu` (and remove the deprecated key); otherwise choose a
//! divisor of the mini-batch size.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::{critic_runs, nearest_divisor};

const CODE: Code = Code("V003");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let a = &c.actor_rollout_ref.actor;
    if !a.use_dynamic_bsz
        && let Some(micro) = a.ppo_micro_batch_size
    {
        push(
            ctx,
            out,
            "actor_rollout_ref.actor",
            a.ppo_mini_batch_size,
            micro,
        );
    }
    if critic_runs(c)
        && !c.critic.use_dynamic_bsz
        && let Some(micro) = c.critic.ppo_micro_batch_size
    {
        push(ctx, out, "critic", c.critic.ppo_mini_batch_size, micro);
    }
}

fn push(ctx: &RuleContext, out: &mut Vec<Diagnostic>, role: &str, mini: i64, micro: i64) {
    if micro <= 0 || mini % micro == 0 {
        return;
    }
    let key = format!("{role}.ppo_micro_batch_size");
    let mini_key = format!("{role}.ppo_mini_batch_size");
    let suggestion = nearest_divisor(mini, micro).unwrap_or(1);
    out.push(
        Diagnostic::error(CODE, format!("ppo_mini_batch_size {mini} of `{role}` is not a multiple of its ppo_micro_batch_size {micro}"))
            .with_key(key.clone())
            .with_primary(ctx.origin(&key), format!("micro-batch of {micro}"))
            .with_secondary(ctx.origin(&mini_key), format!("mini-batch of {mini}"))
            .with_help(format!(
                "replace `{key}` by `{key}_per_gpu`, or set it to a divisor of {mini}, e.g. {suggestion}"
            )),
    );
}
