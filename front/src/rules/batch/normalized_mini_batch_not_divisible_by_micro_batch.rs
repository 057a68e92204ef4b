//! ## What it checks
//! In verl's legacy FSDP workers, the per-rank mini-batch (`ppo_mini_batch_size × rollout.n ÷
//! data-parallel size`, in responses) must be a whole number of per-rank micro-batches
//! (`ppo_micro_batch_size_per_gpu`, or the deprecated global `ppo_micro_batch_size` divided by
//! the data-parallel size). Checked for the actor and for the critic when it runs.
//!
//! ## Why
//! The worker asserts it when it starts ("normalized ppo_mini_batch_size … should be divisible
//! by ppo_micro_batch_size_per_gpu …"): gradient accumulation runs a whole number of
//! micro-batches per optimizer step.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     ppo_mini_batch_size: 32        # × n=4 over 8 ranks = 16 responses per rank
//!     ppo_micro_batch_size_per_gpu: 6   # 16 is not a multiple of 6
//!   rollout:
//!     n: 4
//! ```
//!
//! ## Fix
//! Choose a per-GPU micro-batch that divides the per-rank mini-batch (4 or 8 above), or
//! change the mini-batch size.

use crate::diag::{Code, Diagnostic};
use crate::role::Role;
use crate::rules::RuleContext;
use crate::rules::facts::{nearest_divisor, push_unique};

const CODE: Code = Code("V006");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    for (role, batch) in Role::trained(ctx.config) {
        if role.engine_worker || !role.is_fsdp() || role.sp <= 0 {
            continue;
        }
        let dp = role.world / role.sp;
        if dp <= 0 {
            continue;
        }
        let per_rank = batch.mini.saturating_mul(batch.n) / dp;
        if per_rank <= 0 {
            continue; // V005
        }
        // The deprecated global size replaces the per-GPU one after division.
        let (micro, key) = match (batch.micro_global, batch.micro_per_gpu) {
            (Some(global), _) => (global / dp, format!("{}.ppo_micro_batch_size", role.prefix)),
            (None, Some(per_gpu)) => (
                per_gpu,
                format!("{}.ppo_micro_batch_size_per_gpu", role.prefix),
            ),
            (None, None) => continue,
        };
        if micro <= 0 || per_rank % micro == 0 {
            continue;
        }
        let suggestion = nearest_divisor(per_rank, micro).unwrap_or(1);
        push_unique(
            out,
            Diagnostic::error(
                CODE,
                format!(
                    "the per-rank mini-batch of {per_rank} responses (ppo_mini_batch_size {} × n {} ÷ {dp} ranks) is not a multiple of the micro-batch {micro}",
                    batch.mini, batch.n
                ),
            )
            .with_key(key.clone())
            .with_primary(ctx.origin(&key), format!("{micro} responses per micro-batch and GPU"))
            .with_secondary(ctx.origin(&format!("{}.ppo_mini_batch_size", role.prefix)), "mini-batch set here")
            .with_help(format!(
                "set `{}.ppo_micro_batch_size_per_gpu` to a divisor of {per_rank}, e.g. {suggestion}",
                role.prefix
            )),
        );
    }
}
