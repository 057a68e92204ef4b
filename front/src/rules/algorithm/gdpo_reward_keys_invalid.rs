//! ## What it checks
//! With `algorithm.adv_estimator: gdpo`: `algorithm.gdpo_reward_keys` lists at least one key,
//! `gdpo_reward_weights` (when set) has one weight per key, and the keys can come from the
//! reward: a custom `compute_score` that returns a dict (any key), or verlc's built-in scorers,
//! which return a number (the DAPO and GDPO managers add `acc`). A reward model's score has no
//! components.
//!
//! ## Why
//! GDPO normalises each reward component within its group before summing them. verl 0.9
//! asserts "GDPO requires 'algorithm.gdpo_reward_keys'" and "GDPO reward key … not found" at
//! the first advantage computation, after the rollout has run; fewer weights than keys fail
//! there with an index error.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   adv_estimator: gdpo
//!   gdpo_reward_keys: [format_reward, accuracy_reward]
//!   gdpo_reward_weights: [1.0]
//! ```
//!
//! ## Fix
//! Name the keys your `compute_score` returns (`+algorithm.gdpo_reward_keys=[a,b]`), give one
//! weight per key or none, and score with a custom reward function that returns them.

use crate::config::AdvEstimator;
use crate::diag::{Code, Diagnostic};
use crate::reward::Rewards;
use crate::rules::RuleContext;

const CODE: Code = Code("V056");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let alg = &c.algorithm;
    if alg.adv_estimator != AdvEstimator::Gdpo {
        return;
    }
    let est = "algorithm.adv_estimator";
    let keys_key = "algorithm.gdpo_reward_keys";
    let keys = alg.gdpo_reward_keys.as_deref().unwrap_or_default();
    if keys.is_empty() {
        let at = ctx.origin(keys_key).or_else(|| ctx.origin(est));
        out.push(
            Diagnostic::error(CODE, "gdpo needs the reward components to normalise: `algorithm.gdpo_reward_keys` is empty")
                .with_key(keys_key)
                .with_primary(at, "gdpo chosen here without reward keys")
                .with_help(format!("list the keys your compute_score returns, e.g. `+{keys_key}=[format_reward,accuracy_reward]`")),
        );
        return;
    }
    let weights_key = "algorithm.gdpo_reward_weights";
    if let Some(w) = &alg.gdpo_reward_weights
        && w.len() != keys.len()
    {
        out.push(
            Diagnostic::error(
                CODE,
                format!(
                    "{} GDPO reward weights for {} reward keys",
                    w.len(),
                    keys.len()
                ),
            )
            .with_key(weights_key)
            .with_primary(ctx.origin(weights_key), format!("{} weights", w.len()))
            .with_secondary(ctx.origin(keys_key), format!("{} keys", keys.len()))
            .with_help(format!(
                "give one weight per key, or remove `{weights_key}` to weigh them equally"
            )),
        );
    }
    let rewards = Rewards::of(c, ctx.root);
    if rewards.model_scores() {
        let on = rewards.model.enable_key();
        out.push(
            Diagnostic::error(CODE, "gdpo reads the components of the reward function's result; a reward model's score has none")
                .with_key(on)
                .with_primary(ctx.origin(on), "reward model on")
                .with_secondary(ctx.origin(est), "gdpo chosen here")
                .with_help("score with a custom reward function that returns a dict with the keys, or pick another estimator"),
        );
        return;
    }
    if rewards.function.path.is_some() {
        return;
    }
    // verlc's built-in scorers return a number; the DAPO and GDPO managers record it as `acc`.
    let available: &[&str] = if matches!(rewards.manager.name, "dapo" | "gdpo") {
        &["acc"]
    } else {
        &[]
    };
    let missing: Vec<&str> = keys
        .iter()
        .map(String::as_str)
        .filter(|k| !available.contains(k))
        .collect();
    if !missing.is_empty() {
        out.push(
            Diagnostic::error(
                CODE,
                format!(
                    "no reward component named {} comes from verlc's built-in scorers, which return one number",
                    missing.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
                ),
            )
            .with_key(keys_key)
            .with_primary(ctx.origin(keys_key).or_else(|| ctx.origin(est)), "reward keys named here")
            .with_help("set `custom_reward_function.path` to a compute_score that returns a dict with these keys"),
        );
    }
}
