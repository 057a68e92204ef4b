//! ## What it checks
//! A value verl added after the release the config tree belongs to: the estimators
//! `optimal_token_baseline`, `tir_optimal_token_baseline`, `gdpo` and the policy losses
//! `dppo_tv`, `dppo_kl` (verl 0.7.1), the policy loss `dro` and the loss aggregation `token-sum`
//! (0.9.0), on an older tree (the built-in 0.7.0 one, `--verl-version 0.7.x`, or a config dir
//! of that release). An error: `check` answers whether the judged release starts.
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
//! Pick a value the release knows, or move the config to the newer release (`verlc migrate`,
//! then check it against that release).

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
    let release = ctx.release_triple();
    for &(key, value, since) in LATER {
        if release >= since || ctx.node(key).and_then(|n| n.as_str()) != Some(value) {
            continue;
        }
        let have = ctx.release_label();
        let added = format!("{}.{}.{}", since.0, since.1, since.2);
        // The critic's copy of the actor's value is one mistake, reported at the actor's.
        if key == "critic.loss_agg_mode"
            && ctx.origin(key) == ctx.origin("actor_rollout_ref.actor.loss_agg_mode")
        {
            continue;
        }
        out.push(
            Diagnostic::error(
                CODE,
                format!("`{value}` arrived in verl {added}; this config tree is verl {have}, which raises on it at start-up"),
            )
            .with_key(key)
            .with_primary(ctx.origin(key), format!("`{value}` set here"))
            .with_help(format!("choose a value verl {have} has, or move the config to verl {added}+ (`verlc migrate`, then `--verl-version {added}` or that release's `--config-dir`)")),
        );
    }
}
