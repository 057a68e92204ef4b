//! ## What it checks
//! `algorithm.adv_estimator: gae` with the critic switched off (`critic.enable: false`).
//!
//! ## Why
//! GAE computes advantages from the critic's value estimates. With the critic off, verl starts
//! the cluster, generates the first batch, and then fails with a `KeyError` on `values` when
//! it computes the advantages.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   adv_estimator: gae
//! critic:
//!   enable: false
//! ```
//!
//! ## Fix
//! Turn the critic on (`critic.enable: true`, or leave it null: verl runs it for `gae`), or
//! choose an estimator without a critic, such as `grpo`.

use crate::config::AdvEstimator;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V044");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    if c.algorithm.adv_estimator != AdvEstimator::Gae || c.critic.enable != Some(false) {
        return;
    }
    let key = "critic.enable";
    out.push(
        Diagnostic::error(
            CODE,
            "GAE needs the critic's values, but the critic is switched off",
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "critic disabled here")
        .with_secondary(ctx.origin("algorithm.adv_estimator"), "gae chosen here")
        .with_help("set `critic.enable: true` (or null), or use a critic-free estimator such as `algorithm.adv_estimator=grpo`"),
    );
}
