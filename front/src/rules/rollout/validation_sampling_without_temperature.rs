//! ## What it checks
//! `actor_rollout_ref.rollout.val_kwargs.do_sample: true` while
//! `actor_rollout_ref.rollout.temperature` (the training temperature) is 0.
//!
//! ## Why
//! verl's `validate_config` asserts "validation gen temperature should be greater than 0 when
//! enabling do_sample". Note that it tests the training `temperature`, not
//! `val_kwargs.temperature`; verlc reports what verl enforces.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   rollout:
//!     temperature: 0
//!     val_kwargs:
//!       do_sample: true
//! ```
//!
//! ## Fix
//! Give `rollout.temperature` a positive value, or turn validation sampling off.

use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V024");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let r = &ctx.config.actor_rollout_ref.rollout;
    if !r.val_kwargs.do_sample || r.temperature > 0.0 {
        return;
    }
    let key = "actor_rollout_ref.rollout.temperature";
    out.push(
        Diagnostic::error(CODE, format!("validation sampling is on but rollout.temperature is {}", r.temperature))
            .with_key(key)
            .with_primary(ctx.origin(key), "temperature 0")
            .with_secondary(ctx.origin("actor_rollout_ref.rollout.val_kwargs.do_sample"), "validation sampling turned on here")
            .with_note("verl checks the training temperature here, not `val_kwargs.temperature`")
            .with_help(format!("set `{key}` above 0 (e.g. 1.0), or `actor_rollout_ref.rollout.val_kwargs.do_sample=false`")),
    );
}
