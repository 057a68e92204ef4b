//! ## What it checks
//! A straight-through KL estimator (`k1+`, `k3+`, `kl+`, `abs+`, `low_var_kl+`) in
//! `actor_rollout_ref.actor.kl_loss_type` with `use_kl_loss`, or in `algorithm.kl_penalty`
//! with `use_kl_in_reward`. A warning: verl's docs list these names and its schema accepts them.
//!
//! ## Why
//! verl 0.7.0's `kl_penalty` hands the name with its `+` to `kl_penalty_forward`, which knows
//! only the plain names and raises `NotImplementedError`: the verl run fails at the first KL
//! computation, after the cluster has started and the first batch was generated. verlc's trainer
//! implements what verl documents (the plain estimator's value with the `k2` gradient), so the
//! config runs here but not in verl.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     use_kl_loss: true
//!     kl_loss_type: k3+
//! ```
//!
//! ## Fix
//! For verl, use the plain estimator (`low_var_kl`/`k3`); keep the `+` only for verlc.

use crate::config::KlEstimator;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V052");

fn straight_through(k: KlEstimator) -> Option<&'static str> {
    match k {
        KlEstimator::KlPlus => Some("kl+"),
        KlEstimator::K1Plus => Some("k1+"),
        KlEstimator::AbsPlus => Some("abs+"),
        KlEstimator::LowVarKlPlus => Some("low_var_kl+"),
        KlEstimator::K3Plus => Some("k3+"),
        _ => None,
    }
}

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let uses = [
        (
            c.actor_rollout_ref.actor.use_kl_loss,
            c.actor_rollout_ref.actor.kl_loss_type,
            "actor_rollout_ref.actor.kl_loss_type",
        ),
        (
            c.algorithm.use_kl_in_reward,
            c.algorithm.kl_penalty,
            "algorithm.kl_penalty",
        ),
    ];
    for (on, estimator, key) in uses {
        let Some(name) = straight_through(estimator).filter(|_| on) else {
            continue;
        };
        out.push(
            Diagnostic::warning(
                CODE,
                format!("verl 0.7.0 raises NotImplementedError for the KL estimator `{name}` at its first KL computation; verlc runs it (value of the plain estimator, gradient of k2)"),
            )
            .with_key(key)
            .with_primary(ctx.origin(key), "straight-through estimator")
            .with_help(format!("for a config verl also runs, use `{}`", name.trim_end_matches('+'))),
        );
    }
}
