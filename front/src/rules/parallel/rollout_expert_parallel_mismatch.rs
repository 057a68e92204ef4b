//! ## What it checks
//! When a rollout's `expert_parallel_size` is above 1 it must equal
//! `tensor_model_parallel_size × data_parallel_size` of the same rollout. Checked for
//! `actor_rollout_ref.rollout` and, when the reward model is enabled, `reward_model.rollout`.
//!
//! ## Why
//! The inference engines spread the experts over all ranks of a replica; verl asserts it when
//! it builds the rollout config ("expert_parallel_size must be equal to
//! tensor_model_parallel_size * data_parallel_size").
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   rollout:
//!     tensor_model_parallel_size: 2
//!     data_parallel_size: 2
//!     expert_parallel_size: 2     # must be 4
//! ```
//!
//! ## Fix
//! Set `expert_parallel_size` to tensor × data parallel, or to 1.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V018");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let r = &c.actor_rollout_ref.rollout;
    push(
        ctx,
        out,
        "actor_rollout_ref.rollout",
        r.expert_parallel_size,
        r.tensor_model_parallel_size,
        r.data_parallel_size,
    );
    // The 0.7.0 layout's reward model server (0.7.1+'s `reward.reward_model.rollout` is not
    // modelled key by key).
    if c.reward_model.enable && c.reward.is_none() {
        let rr = &c.reward_model.rollout;
        push(
            ctx,
            out,
            "reward_model.rollout",
            rr.expert_parallel_size,
            rr.tensor_model_parallel_size,
            rr.data_parallel_size,
        );
    }
}

fn push(ctx: &RuleContext, out: &mut Vec<Diagnostic>, prefix: &str, ep: i64, tp: i64, dp: i64) {
    let want = tp.saturating_mul(dp);
    if ep <= 1 || ep == want {
        return;
    }
    let key = format!("{prefix}.expert_parallel_size");
    out.push(
        Diagnostic::error(CODE, format!("expert parallel size {ep} of `{prefix}` must equal tensor {tp} × data {dp} = {want}"))
            .with_key(key.clone())
            .with_primary(ctx.origin(&key), format!("expert parallel {ep}"))
            .with_secondary(ctx.origin(&format!("{prefix}.tensor_model_parallel_size")), format!("tensor parallel {tp}"))
            .with_secondary(ctx.origin(&format!("{prefix}.data_parallel_size")), format!("data parallel {dp}"))
            .with_help(format!("set `{key}` to {want}, or to 1 to turn expert parallelism off")),
    );
}
