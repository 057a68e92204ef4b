//! ## What it checks
//! A PPO mini-batch, `ppo_mini_batch_size × rollout.n` responses, should split evenly over
//! the data-parallel ranks (GPUs ÷ sequence parallel for FSDP, GPUs ÷ tensor·pipeline·context
//! parallel for Megatron). Checked for the actor and for the critic when it runs.
//!
//! ## Why
//! verl's engine workers (`trainer.use_legacy_worker_impl: disable`) assert it in
//! `TrainingWorker.train_mini_batch` ("Got mini_batch_size=… and …get_data_parallel_size()=…"),
//! at the first update step. The legacy workers round the per-rank size down instead, so the
//! last mini-batch of every step is a smaller one and the number of optimizer steps is not the
//! one you planned (a warning).
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     ppo_mini_batch_size: 20    # 20 responses over 8 ranks
//! trainer:
//!   n_gpus_per_node: 8
//!   use_legacy_worker_impl: disable
//! ```
//!
//! ## Fix
//! Make `ppo_mini_batch_size × rollout.n` a multiple of the data-parallel size (16 or 24
//! above).

use crate::diag::{Code, Diagnostic};
use crate::role::Role;
use crate::rules::RuleContext;
use crate::rules::facts::{gcd, nearest_multiple, push_unique};

const CODE: Code = Code("V007");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    for (role, batch) in Role::trained(ctx.config) {
        let Some(dp) = role.dp() else { continue };
        let responses = batch.mini.saturating_mul(batch.n);
        if dp <= 0 || responses % dp == 0 {
            continue;
        }
        // Below one response per rank the legacy FSDP worker fails outright (V005).
        if !role.engine_worker && role.is_fsdp() && responses < dp {
            continue;
        }
        let key = format!("{}.ppo_mini_batch_size", role.prefix);
        let step = dp / gcd(dp, batch.n.max(1));
        let suggestion = nearest_multiple(batch.mini, step);
        let message = format!(
            "a mini-batch of {responses} responses (ppo_mini_batch_size {} × n {}) does not split evenly over {dp} data-parallel ranks",
            batch.mini, batch.n
        );
        let d = if role.engine_worker {
            Diagnostic::error(CODE, message)
        } else {
            Diagnostic::warning(CODE, message).with_note(format!(
                "verl's legacy worker rounds the per-rank mini-batch down to {}, so each step ends with a smaller extra mini-batch",
                responses / dp
            ))
        };
        let mut d = d
            .with_key(key.clone())
            .with_primary(
                ctx.origin(&key),
                format!("{} prompts per mini-batch", batch.mini),
            )
            .with_secondary(
                ctx.origin("trainer.n_gpus_per_node"),
                "GPUs per node set here",
            );
        if batch.n > 1 {
            d = d.with_secondary(
                ctx.origin(batch.n_key),
                format!("{} responses per prompt", batch.n),
            );
        }
        push_unique(
            out,
            d.with_help(format!(
                "set `{key}` to a multiple of {step}, e.g. {suggestion}"
            )),
        );
    }
}
