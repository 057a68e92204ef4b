//! ## What it checks
//! With the in-reward KL penalty on (`algorithm.use_kl_in_reward: true`) and the adaptive
//! controller (`algorithm.kl_ctrl.type: adaptive`), `algorithm.kl_ctrl.horizon` must be
//! positive.
//!
//! ## Why
//! The adaptive controller scales its update by `n_steps / horizon`; verl asserts "horizon
//! must be larger than 0" when the trainer builds the controller.
//!
//! ## Example
//! ```yaml
//! algorithm:
//!   use_kl_in_reward: true
//!   kl_ctrl:
//!     type: adaptive
//!     horizon: 0
//! ```
//!
//! ## Fix
//! Give a positive horizon (verl's default is 10000), or use the `fixed` controller.

use crate::config::KlCtrlType;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V027");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let a = &ctx.config.algorithm;
    if !a.use_kl_in_reward || a.kl_ctrl.kind != KlCtrlType::Adaptive || a.kl_ctrl.horizon > 0 {
        return;
    }
    let key = "algorithm.kl_ctrl.horizon";
    out.push(
        Diagnostic::error(CODE, format!("the adaptive KL controller needs a positive horizon, got {}", a.kl_ctrl.horizon))
            .with_key(key)
            .with_primary(ctx.origin(key), format!("horizon {}", a.kl_ctrl.horizon))
            .with_secondary(ctx.origin("algorithm.kl_ctrl.type"), "adaptive controller chosen here")
            .with_help(format!("set `{key}` to a positive number of samples (verl's default is 10000), or `algorithm.kl_ctrl.type=fixed`")),
    );
}
