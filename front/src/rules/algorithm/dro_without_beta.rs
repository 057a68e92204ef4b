//! ## What it checks
//! With `actor_rollout_ref.actor.policy_loss.loss_mode: dro`, `policy_loss.dro_beta` must be
//! a positive number.
//!
//! ## Why
//! DRO's loss is `−(A·log π − ½·β·(log π − log π_old)²)`: without β there is no penalty to
//! weigh. verl 0.9 raises "policy_loss.dro_beta must be a positive value when using DRO" at
//! the first actor update, after the rollout has run.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     policy_loss:
//!       loss_mode: dro
//!       dro_beta: null
//! ```
//!
//! ## Fix
//! Set `actor_rollout_ref.actor.policy_loss.dro_beta` to a positive weight (the DRO paper's
//! runs use values around 0.1 to 1), or pick another `loss_mode`.

use crate::config::PolicyLossMode;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V054");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let pl = &ctx.config.actor_rollout_ref.actor.policy_loss;
    if pl.loss_mode != PolicyLossMode::Dro || pl.dro_beta.is_some_and(|b| b > 0.0) {
        return;
    }
    let key = "actor_rollout_ref.actor.policy_loss.dro_beta";
    let mode = "actor_rollout_ref.actor.policy_loss.loss_mode";
    let got = pl.dro_beta.map_or("null".to_owned(), |b| b.to_string());
    let diag = Diagnostic::error(
        CODE,
        format!("the DRO policy loss needs a positive dro_beta, got {got}"),
    )
    .with_key(key)
    .with_help(format!(
        "set `{key}` to a positive weight of the quadratic log-ratio penalty, or another `{mode}`"
    ));
    // Trees before verl 0.9 have no dro_beta: then the loss mode is where the fix goes.
    out.push(match ctx.origin(key) {
        Some(at) => diag
            .with_primary(Some(at), format!("dro_beta is {got}"))
            .with_secondary(ctx.origin(mode), "DRO chosen here"),
        None => diag.with_primary(ctx.origin(mode), "DRO chosen here, without dro_beta"),
    });
}
