//! ## What it checks
//! For each role verl validates (actor, old-log-prob pass of the rollout, reference policy
//! when it runs, critic when it runs, reward model when enabled without the reward loop), the
//! deprecated global micro-batch size (`ppo_micro_batch_size`, `log_prob_micro_batch_size`,
//! `micro_batch_size`) and its `_per_gpu` replacement must not both be set while dynamic
//! batching is off.
//!
//! ## Why
//! verl refuses the pair ("You have set both '…' AND '…_per_gpu'. Please remove '…' because
//! only '*_…_per_gpu' is supported"). In the critic, `ppo_micro_batch_size_per_gpu` copies
//! `ppo_micro_batch_size` by default, so setting only the deprecated key already trips it.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     ppo_micro_batch_size: 64
//!     ppo_micro_batch_size_per_gpu: 8
//! ```
//!
//! ## Fix
//! Remove the deprecated global key and keep the `_per_gpu` one.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;
use crate::rules::facts::micro_pairs;

const CODE: Code = Code("V008");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    for pair in micro_pairs(ctx.config) {
        if !pair.exactly_one {
            continue;
        }
        let (Some(global), Some(per_gpu)) = (pair.global, pair.per_gpu) else {
            continue;
        };
        let global_key = pair.global_key();
        let per_gpu_key = pair.per_gpu_key();
        let global_origin = ctx.origin(&global_key);
        let per_gpu_origin = ctx.origin(&per_gpu_key);
        let mirrored = global_origin.is_some() && global_origin == per_gpu_origin;
        let mut d = Diagnostic::error(
            CODE,
            format!("both `{global_key}` ({global}) and `{per_gpu_key}` ({per_gpu}) are set; verl accepts only one"),
        )
        .with_key(global_key.clone())
        .with_primary(global_origin, "deprecated global micro-batch size set here");
        if mirrored {
            d = d.with_note(format!("`{per_gpu_key}` copies `{global_key}` by default, so setting the deprecated key alone sets both"));
        } else {
            d = d.with_secondary(per_gpu_origin, "per-GPU micro-batch size set here");
        }
        out.push(d.with_help(format!(
            "remove `{global_key}` and give only `{per_gpu_key}` (responses per GPU)"
        )));
    }
}
