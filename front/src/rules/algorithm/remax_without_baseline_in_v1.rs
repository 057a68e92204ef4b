//! ## What it checks
//! `algorithm.adv_estimator: remax` where verl 0.9's v1 trainer runs (`trainer.use_v1` is true
//! by default there).
//!
//! ## Why
//! ReMax's advantage subtracts the reward of a greedy rollout of each prompt
//! (`reward_baselines`). verl's legacy trainer generates that rollout; the v1 trainer (every
//! `trainer.v1.trainer_mode`) does not, and its advantage step calls ReMax's estimator without
//! the baselines: the run stops with a `TypeError` at the first step.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   adv_estimator: remax
//! ```
//!
//! ## Fix
//! Set `trainer.use_v1: false` (the legacy trainer, synchronous only), or use another
//! critic-free estimator (`grpo`, `rloo`, `reinforce_plus_plus`, ...).

use verlc_spec::algo::AdvEstimator;

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V066");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    if ctx.config.algorithm.adv_estimator != AdvEstimator::Remax || ctx.v1_trainer_mode().is_none()
    {
        return;
    }
    let key = "algorithm.adv_estimator";
    out.push(
        Diagnostic::error(
            CODE,
            format!(
                "verl {}'s v1 trainer does not generate ReMax's greedy baseline rollout: its advantage step calls the remax estimator without `reward_baselines` and stops at the first step",
                ctx.release_label()
            ),
        )
        .with_key(key)
        .with_primary(ctx.origin(key), "remax chosen here")
        .with_help("set `trainer.use_v1=false` (verl's legacy trainer generates the baseline), or use another estimator"),
    );
}
