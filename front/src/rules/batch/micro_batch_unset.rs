//! ## What it checks
//! For each role verl validates (actor, old-log-prob pass of the rollout, reference policy
//! when it runs, critic when it runs, reward model when enabled without the reward loop),
//! a micro-batch size must be given while dynamic batching is off: the `_per_gpu` key (or the
//! deprecated global one). verl's defaults leave all of them null. The legacy Megatron
//! reference worker needs one even with dynamic batching.
//!
//! ## Why
//! verl stops in `validate_config` or the role's dataclass ("Please set at least one of '…' or
//! '…_per_gpu'"), and the Megatron reference worker asserts the same when it starts.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     ppo_mini_batch_size: 64
//!     # no ppo_micro_batch_size_per_gpu
//! ```
//!
//! ## Fix
//! Set the `_per_gpu` size (responses per forward/backward pass on one GPU; it must divide the
//! per-rank mini-batch for training roles), or turn on `use_dynamic_bsz` to batch by tokens.

use crate::diag::{Code, Diagnostic};
use crate::role::Role;
use crate::rules::RuleContext;
use crate::rules::facts::{micro_pairs, nearest_divisor};

const CODE: Code = Code("V009");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    for pair in micro_pairs(ctx.config) {
        if !(pair.exactly_one || pair.at_least_one)
            || pair.global.is_some()
            || pair.per_gpu.is_some()
        {
            continue;
        }
        let per_gpu_key = pair.per_gpu_key();
        let example = suggestion(ctx, pair.prefix);
        let help = if pair.exactly_one {
            format!(
                "set `{per_gpu_key}` (e.g. {example}), or turn on `{}` to batch by tokens",
                pair.dynamic_key
            )
        } else {
            format!(
                "set `{per_gpu_key}` (e.g. {example}); the Megatron reference worker needs it even with dynamic batching"
            )
        };
        out.push(
            Diagnostic::error(
                CODE,
                format!(
                    "no micro-batch size for `{}`: `{per_gpu_key}` is null",
                    pair.prefix
                ),
            )
            .with_key(per_gpu_key.clone())
            .with_primary(null_site(ctx, &per_gpu_key), "left null here")
            .with_help(help),
        );
    }
}

/// Where the null was written: the key itself when its value came through an interpolation
/// (`${oc.select:.ppo_micro_batch_size,null}`), else the value.
fn null_site(ctx: &RuleContext, key: &str) -> Option<crate::source::Origin> {
    let node = ctx.node(key)?;
    node.via.as_deref().cloned().or_else(|| node.origin.clone())
}

/// A per-GPU size that divides the per-rank mini-batch of a training role, else 4.
fn suggestion(ctx: &RuleContext, prefix: &str) -> i64 {
    Role::trained(ctx.config)
        .into_iter()
        .find(|(r, _)| r.prefix == prefix)
        .and_then(|(r, b)| {
            // The legacy FSDP worker divides without checking; the others need an exact split.
            let dp = if r.is_fsdp() && !r.engine_worker {
                (r.sp > 0).then(|| r.world / r.sp)?
            } else {
                r.dp()?
            };
            let per_rank = b.mini.saturating_mul(b.n) / dp.max(1);
            nearest_divisor(per_rank, 4)
        })
        .unwrap_or(4)
}
