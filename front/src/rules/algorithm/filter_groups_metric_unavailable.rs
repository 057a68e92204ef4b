//! ## What it checks
//! With `algorithm.filter_groups.enable: true`: a `metric` is set, and it can be read when
//! the groups are judged: `reward` (the sequence score) always, any other name only as a key
//! of a custom `compute_score`'s result dict (verlc's built-in scorers return one number; the
//! DAPO and GDPO managers record it as `acc`). A reward model sharing the trainer's devices
//! (`reward_model.enable` without `enable_resource_pool`) scores too late for filtering.
//!
//! ## Why
//! DAPO's dynamic sampling drops the prompt groups whose metric is the same for every
//! response. verl 0.9 raises "algorithm.filter_groups.metric must be set when group filtering
//! is enabled" and asserts on a colocated reward model at start-up, and fails with "Finished
//! groups are missing DAPO metric" once the first groups are scored without the key. Names
//! from verl's older DAPO recipe (`seq_reward`, `seq_final_reward`) are plain dict keys in 0.9.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   filter_groups:
//!     enable: true
//!     metric: seq_reward
//! ```
//!
//! ## Fix
//! Use `metric: reward`, or a key your `compute_score` returns (`acc`, …) with
//! `custom_reward_function.path`; for a reward model, give it its own resource pool.

use crate::diag::{Code, Diagnostic};
use crate::reward::Rewards;
use crate::rules::RuleContext;

const CODE: Code = Code("V057");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let Some(f) = c.algorithm.filter_groups.as_ref().filter(|f| f.enable) else {
        return;
    };
    let enable = "algorithm.filter_groups.enable";
    let metric_key = "algorithm.filter_groups.metric";
    let metric = f.metric.as_deref().unwrap_or_default();
    if metric.is_empty() {
        out.push(
            Diagnostic::error(
                CODE,
                "group filtering needs a metric: `algorithm.filter_groups.metric` is not set",
            )
            .with_key(metric_key)
            .with_primary(
                ctx.origin(metric_key).or_else(|| ctx.origin(enable)),
                "no metric",
            )
            .with_help(format!(
                "set `{metric_key}=reward` (the sequence score) or a key your compute_score returns"
            )),
        );
        return;
    }
    let rewards = Rewards::of(c, ctx.root);
    let (pool, pool_key) = rewards.model.resource_pool();
    if rewards.model.enabled() && !pool {
        let on = rewards.model.enable_key();
        out.push(
            Diagnostic::error(CODE, "group filtering judges groups as they are scored, but a reward model on the trainer's devices scores after sampling (verl asserts)")
                .with_key(on)
                .with_primary(ctx.origin(on), "colocated reward model")
                .with_secondary(ctx.origin(enable), "group filtering on")
                .with_help(format!("set `{pool_key}=true`, or score with a reward function")),
        );
        return;
    }
    if metric == "reward" {
        return;
    }
    let model_scores = rewards.model_scores();
    let custom = !model_scores && rewards.function.path.is_some();
    let from_builtin =
        !model_scores && matches!(rewards.manager.name, "dapo" | "gdpo") && metric == "acc";
    if custom || from_builtin {
        return;
    }
    let source = if model_scores {
        "a reward model's score has no other keys"
    } else {
        "verlc's built-in scorers return one number"
    };
    out.push(
        Diagnostic::error(
            CODE,
            format!("the group metric `{metric}` is read from compute_score's result dict, but {source}"),
        )
        .with_key(metric_key)
        .with_primary(ctx.origin(metric_key), "metric named here")
        .with_help("use `metric: reward` (the sequence score), or a key a custom compute_score returns (custom_reward_function.path)"),
    );
}
