//! ## What it checks
//! With `algorithm.adv_estimator: optimal_token_baseline` (or `tir_optimal_token_baseline`),
//! `actor_rollout_ref.actor.calculate_sum_pi_squared` must be true and the old-log-prob pass
//! must run (no rollout-correction `bypass_mode`).
//!
//! ## Why
//! The estimators weigh each trajectory by its accumulated path variance
//! `Σ_t (1 − 2π_t + Σ_v π_v²)`, and `Σ_v π_v²` comes from the old-log-prob pass only when
//! `calculate_sum_pi_squared` is on. verl 0.9 asserts "Step-dependent optimal baseline
//! requires sum_pi_squared from actor" when computing the first advantages, after the rollout
//! has run; bypass mode skips that pass, so the assertion fires there too.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   adv_estimator: optimal_token_baseline
//! actor_rollout_ref:
//!   actor:
//!     calculate_sum_pi_squared: false
//! ```
//!
//! ## Fix
//! Set `actor_rollout_ref.actor.calculate_sum_pi_squared=true` (and leave
//! `algorithm.rollout_correction.bypass_mode` off), or pick another estimator.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V055");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let c = ctx.config;
    let est = c.algorithm.adv_estimator;
    if !est.needs_sum_pi_squared() {
        return;
    }
    let estimator = "algorithm.adv_estimator";
    let key = "actor_rollout_ref.actor.calculate_sum_pi_squared";
    let on = c.actor_rollout_ref.actor.calculate_sum_pi_squared == Some(true);
    if !on {
        let diag = Diagnostic::error(
            CODE,
            format!(
                "`{}` needs the old policy's Σπ² per token, but `{key}` is not true",
                est.as_str()
            ),
        )
        .with_key(key)
        .with_help(format!("set `{key}=true`, or pick another estimator"));
        // Trees before verl 0.9 have no such key: then the estimator is where the fix goes.
        out.push(match ctx.origin(key) {
            Some(at) => diag
                .with_primary(Some(at), "Σπ² not computed")
                .with_secondary(ctx.origin(estimator), "estimator chosen here"),
            None => diag.with_primary(ctx.origin(estimator), "estimator chosen here"),
        });
        return;
    }
    let bypass = "algorithm.rollout_correction.bypass_mode";
    if c.algorithm.rollout_correction.bypass_mode {
        out.push(
            Diagnostic::error(
                CODE,
                format!(
                    "`{}` needs the old-log-prob pass for Σπ², which rollout-correction bypass mode skips",
                    est.as_str()
                ),
            )
            .with_key(bypass)
            .with_primary(ctx.origin(bypass), "bypass mode on")
            .with_secondary(ctx.origin(estimator), "estimator chosen here")
            .with_help(format!("set `{bypass}=false` (decoupled mode recomputes the old log-probs), or pick another estimator")),
        );
    }
}
