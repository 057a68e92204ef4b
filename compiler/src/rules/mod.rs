//! verl's cross-field rules, decided before anything runs. One rule per file, grouped by
//! the section it is about; every rule has a stable id (`V0xx`) listed in [`RULES`], the
//! single registry (an id is never reused).
//!
//! A rule is a function of a [`RuleContext`]: the typed config (for the logic) plus the
//! composed tree (for where each value was written) and, when reachable, the model's
//! `config.json` dimensions (for model-aware checks).

use crate::diag::{Code, Diagnostic};

pub mod context;
pub use context::{ModelDims, RuleContext};

/// A registered rule.
pub struct Rule {
    pub code: Code,
    /// The mistake it catches, in ruff's style (`MicroBatchExceedsMiniBatch`).
    pub name: &'static str,
    /// One line for `verlc rule --list`.
    pub summary: &'static str,
    pub check: fn(&RuleContext, &mut Vec<Diagnostic>),
}

/// Every rule, in id order.
pub static RULES: &[Rule] = &[];

/// Run every rule for which `enabled` holds.
pub fn run(ctx: &RuleContext, enabled: &dyn Fn(Code) -> bool) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for r in RULES {
        if enabled(r.code) {
            (r.check)(ctx, &mut out);
        }
    }
    out
}

pub fn find(code: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.code.0.eq_ignore_ascii_case(code))
}
