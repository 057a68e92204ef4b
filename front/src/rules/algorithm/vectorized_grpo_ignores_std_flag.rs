//! ## What it checks
//! `algorithm.adv_estimator: grpo_vectorized` (or verl 0.9's `gdpo`) with
//! `algorithm.norm_adv_by_std_in_grpo: false`.
//! A warning: the config is valid, but verl would not run it as written.
//!
//! ## Why
//! verl 0.7.0's trainer passes `norm_adv_by_std_in_grpo` to `grpo` but not to
//! `grpo_vectorized` (`compute_advantage` calls it with the estimator's own default), so verl
//! always divides the advantages by the group's standard deviation there: the flag is ignored
//! and the run is plain GRPO, not Dr. GRPO. verl 0.9 calls `gdpo` the same way (its per-component
//! normalisation always divides by the std). verlc's trainer honours the flag, so a verlc run and
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
    let est = a.adv_estimator;
    if !matches!(est, AdvEstimator::GrpoVectorized | AdvEstimator::Gdpo)
        || a.norm_adv_by_std_in_grpo
    {
        return;
    }
    let key = "algorithm.norm_adv_by_std_in_grpo";
    out.push(
        Diagnostic::warning(
            CODE,
            format!("verl ignores `norm_adv_by_std_in_grpo: false` for `{est}` and divides by the group std anyway; verlc honours it, so the two runs differ"),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), format!("not applied by verl's {est}"))
        .with_secondary(ctx.origin("algorithm.adv_estimator"), format!("{est} chosen here"))
        .with_help(if est == AdvEstimator::Gdpo {
            "drop the flag: verl's gdpo always divides each component by its group std".to_owned()
        } else {
            "use `algorithm.adv_estimator=grpo`, which honours the flag in verl too".to_owned()
        }),
    );
}
