//! ## What it checks
//! A value verl added after the release the config tree belongs to: the estimators
//! `optimal_token_baseline`, `tir_optimal_token_baseline`, `gdpo` and the policy losses
//! `dppo_tv`, `dppo_kl` (verl 0.7.1), the policy loss `dro` and the loss aggregation `token-sum`
//! (0.9.0), on an older tree (verlc's built-in one is verl 0.7.0's). A warning: verlc runs them
//! as the newer verl does.
//!
//! ## Why
//! verl looks these names up in its registries when the trainer starts (or, for the
//! aggregation, at the first loss): the release the tree comes from raises "Unknown advantage
//! estimator" / "Unsupported loss mode" / "Invalid loss_agg_mode". The config runs under verlc
//! and under the newer verl, not under the release it was written for.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   adv_estimator: gdpo     # on verl 0.7.0's tree
//! ```
//!
//! ## Fix
//! Keep it for verlc (or move the config to the newer verl's tree), or pick a value the release
//! knows.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V058");

/// `(key, value, release that added it)`.
const LATER: &[(&str, &str, (u32, u32, u32))] = &[
    (
        "algorithm.adv_estimator",
        "optimal_token_baseline",
        (0, 7, 1),
    ),
    (
        "algorithm.adv_estimator",
        "tir_optimal_token_baseline",
        (0, 7, 1),
    ),
    ("algorithm.adv_estimator", "gdpo", (0, 7, 1)),
    (
        "actor_rollout_ref.actor.policy_loss.loss_mode",
        "dppo_tv",
        (0, 7, 1),
    ),
    (
        "actor_rollout_ref.actor.policy_loss.loss_mode",
        "dppo_kl",
        (0, 7, 1),
    ),
    (
        "actor_rollout_ref.actor.policy_loss.loss_mode",
        "dro",
        (0, 9, 0),
    ),
    (
        "actor_rollout_ref.actor.loss_agg_mode",
        "token-sum",
        (0, 9, 0),
    ),
    ("critic.loss_agg_mode", "token-sum", (0, 9, 0)),
];

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    // The modelled release is 0.7.0; a tree of another 0.7 release is a later patch (0.7.1).
    let release = match ctx.release {
        None => (0, 7, 0),
        Some((0, 7)) => (0, 7, 1),
        Some((major, minor)) => (major, minor, 0),
    };
    for &(key, value, since) in LATER {
        if release >= since || ctx.node(key).and_then(|n| n.as_str()) != Some(value) {
            continue;
        }
        let (have, added) = (
            format!("{}.{}", release.0, release.1),
            format!("{}.{}.{}", since.0, since.1, since.2),
        );
        // The critic's copy of the actor's value is one mistake, reported at the actor's.
        if key == "critic.loss_agg_mode"
            && ctx.origin(key) == ctx.origin("actor_rollout_ref.actor.loss_agg_mode")
        {
            continue;
        }
        out.push(
            Diagnostic::warning(
                CODE,
                format!("`{value}` arrived in verl {added}; this config tree is verl {have}, which raises on it (verlc runs it as verl {added} does)"),
            )
            .with_key(key)
            .with_primary(ctx.origin(key), format!("`{value}` set here"))
            .with_help(format!("keep it for verlc or verl {added}+, or choose a value verl {have} has")),
        );
    }
}
