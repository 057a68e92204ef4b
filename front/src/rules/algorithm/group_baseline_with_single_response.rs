//! ## What it checks
//! A group-baseline estimator (`grpo`, `grpo_vectorized`, `rloo`, `rloo_vectorized`,
//! `reinforce_plus_plus_baseline`, and verl 0.9's `gdpo`, `optimal_token_baseline`,
//! `tir_optimal_token_baseline`) with one response per prompt (`rollout.n: 1`). A warning:
//! verl runs it.
//!
//! ## Why
//! These estimators compare each response with the other responses to the same prompt. A
//! group of one has nothing to compare with: verl falls back to the raw score (mean 0, std 1
//! for GRPO), or to an advantage of zero (vectorized RLOO), so the run trains without a
//! baseline or does not learn at all.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   adv_estimator: grpo
//! actor_rollout_ref:
//!   rollout:
//!     n: 1
//! ```
//!
//! ## Fix
//! Sample several responses per prompt (`rollout.n` of 4–16 is usual), or use an estimator
//! that does not need a group (`gae` with a critic, `reinforce_plus_plus`).

use crate::config::AdvEstimator;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V049");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let n = c.actor_rollout_ref.rollout.n;
    let (name, what) = match c.algorithm.adv_estimator {
        AdvEstimator::Grpo => ("grpo", "the raw score becomes the advantage (no baseline)"),
        AdvEstimator::GrpoVectorized => (
            "grpo_vectorized",
            "the raw score becomes the advantage (no baseline)",
        ),
        AdvEstimator::ReinforcePlusPlusBaseline => (
            "reinforce_plus_plus_baseline",
            "the raw score becomes the advantage (no baseline)",
        ),
        AdvEstimator::Rloo => ("rloo", "the raw score becomes the advantage (no baseline)"),
        AdvEstimator::RlooVectorized => ("rloo_vectorized", "every advantage is zero"),
        AdvEstimator::Gdpo => (
            "gdpo",
            "each raw component is summed and whitened over the batch (no group baseline)",
        ),
        AdvEstimator::OptimalTokenBaseline | AdvEstimator::TirOptimalTokenBaseline => (
            c.algorithm.adv_estimator.as_str(),
            "the reward-to-go becomes the advantage (no baseline)",
        ),
        _ => return,
    };
    if n != 1 {
        return;
    }
    let key = "actor_rollout_ref.rollout.n";
    out.push(
        Diagnostic::warning(
            CODE,
            format!("`{name}` compares the responses to one prompt, but rollout.n is 1: {what}"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "one response per prompt")
        .with_secondary(
            ctx.origin("algorithm.adv_estimator"),
            format!("{name} chosen here"),
        )
        .with_help(format!(
            "set `{key}` to several responses per prompt (4–16 is usual)"
        )),
    );
}
