//! ## What it checks
//! `algorithm.adv_estimator: grpo_vectorized` with `algorithm.norm_adv_by_std_in_grpo: false`.
//! A warning: the config is valid, but verl would not run it as written.
//!
//! ## Why
//! verl 0.7.0's trainer passes `norm_adv_by_std_in_grpo` to `grpo` but not to
//! `grpo_vectorized` (`compute_advantage` calls it with the estimator's own default), so verl
//! always divides the advantages by the group's standard deviation there: the flag is ignored
//! and the run is plain GRPO, not Dr. GRPO. verlc's trainer honours the flag, so a verlc run and
//! a verl run of this config train differently.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   adv_estimator: grpo_vectorized
//!   norm_adv_by_std_in_grpo: false
//! ```
//!
//! ## Fix
//! Use `adv_estimator: grpo`, which honours the flag in verl too, or drop the flag if plain GRPO
//! was meant.

use crate::config::AdvEstimator;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V051");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let a = &ctx.config.algorithm;
    if a.adv_estimator != AdvEstimator::GrpoVectorized || a.norm_adv_by_std_in_grpo {
        return;
    }
    let key = "algorithm.norm_adv_by_std_in_grpo";
    out.push(
        Diagnostic::warning(
            CODE,
            "verl ignores `norm_adv_by_std_in_grpo: false` for `grpo_vectorized` and divides by the group std anyway; verlc honours it, so the two runs differ",
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "not applied by verl's grpo_vectorized")
        .with_secondary(ctx.origin("algorithm.adv_estimator"), "grpo_vectorized chosen here")
        .with_help("use `algorithm.adv_estimator=grpo`, which honours the flag in verl too"),
    );
}
