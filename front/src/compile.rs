//! The one door from config text to what a trainer runs.
//!
//! `verlc build`, `run` and `smoke`, a built trainer's run-time overrides and the tests all
//! come through [`compile`]: compose and check the request ([`crate::check`]), take the
//! build's view of the findings (what `check` reports as warnings because verl would run it,
//! a binary cannot bind: errors again), then lower a config without errors to its plan
//! ([`crate::plan`] for verl's RL trainer, [`crate::sft::lower`] for its SFT trainer). Nothing
//! else lowers: text that was not checked never becomes a spec.
//!
//! `verlc check` and `explain` stop at the first half ([`crate::check::check`]); they report,
//! they do not lower.

use crate::check::{CheckOptions, Checked, check};
use crate::codes;
use crate::diag::Severity;
use crate::load::compose::LoadRequest;
use crate::load::node::split_key;
use crate::plan::{self, BoundKey, BuildPlan, Planned, SftPlan};
use crate::sft::ConfigKind;

/// Who is compiling, which decides which findings count as errors.
#[derive(Clone, Copy, Debug)]
pub enum Mode<'a> {
    /// `verlc build`, `run`, `smoke`: every verdict of the keys the user changed;
    /// `deny_warnings` makes every warning an error too.
    Build { deny_warnings: bool },
    /// A built trainer's run-time overrides: its embedded config was judged when it was
    /// built, so only the verdicts of keys these overrides touch count.
    Overrides(&'a [String]),
}

/// What a request compiles to.
pub struct Compiled {
    /// The composed config and every finding, in the build's view.
    pub checked: Checked,
    /// What the trainer runs; `None` exactly when the config has errors (or is verl 0.7.0's
    /// legacy SFT config, which is recognised and not built).
    pub planned: Option<Planned>,
}

impl Compiled {
    pub fn has_errors(&self) -> bool {
        self.checked.has_errors()
    }
}

/// Compose, check and lower `req` (see the module docs).
pub fn compile(req: &LoadRequest, opts: &CheckOptions, mode: Mode<'_>) -> Compiled {
    let mut checked = check(req, opts);
    let rl_plan = match mode {
        Mode::Build { deny_warnings } => {
            let plan = promote_for_build(&mut checked, &|_| true);
            if deny_warnings {
                for d in &mut checked.diagnostics {
                    d.severity = Severity::Error;
                }
            }
            plan
        }
        Mode::Overrides(overrides) => {
            let keys: Vec<&str> = overrides.iter().map(|o| plan::override_key(o)).collect();
            promote_for_build(&mut checked, &|k| {
                keys.iter().any(|o| plan::keys_overlap(k, o))
            })
        }
    };
    let planned = if checked.has_errors() {
        None
    } else {
        match checked.kind {
            ConfigKind::Ppo => rl_plan.map(|p| Planned::Rl(Box::new(p))),
            ConfigKind::Sft | ConfigKind::LegacySft => sft_planned(&checked),
        }
    };
    Compiled { checked, planned }
}

/// The plan of a checked SFT config without errors.
fn sft_planned(checked: &Checked) -> Option<Planned> {
    let cfg = checked.sft.as_ref()?;
    let root = &checked.composed.root;
    let release = plan::algo_release(&checked.release_version);
    let (spec, _) = crate::sft::lower::lower(cfg, root, release);
    let bound_keys = crate::sft::lower::BOUND_KEYS
        .iter()
        .filter_map(|k| {
            let node = root.get_path(&split_key(k))?;
            Some(BoundKey {
                key: (*k).to_owned(),
                value: node.to_json(),
            })
        })
        .collect();
    Some(Planned::Sft(Box::new(SftPlan {
        binding: spec.binding,
        bound_keys,
        spec,
    })))
}

/// `verlc check` reports the plan's findings as warnings (what verl accepts but a verlc
/// binary cannot bind); a build needs them as errors. Replace them in `checked` with the
/// build's view: the plan's errors and the verdicts of the keys `verdict_for` accepts
/// (unsupported values are errors). An RL config's plan comes back with them (lowered once).
fn promote_for_build(
    checked: &mut Checked,
    verdict_for: &dyn Fn(&str) -> bool,
) -> Option<BuildPlan> {
    if checked.kind != ConfigKind::Ppo {
        // The check reported what the trainer cannot honour as warnings; for a build they
        // are errors again.
        for d in &mut checked.diagnostics {
            if d.code == codes::BUILD_UNSUPPORTED_SETTING {
                d.severity = Severity::Error;
                d.notes.retain(|n| !n.contains("`verlc build` rejects it"));
            }
        }
        return None;
    }
    let cfg = checked.config.as_ref()?;
    let lowered = plan::lower_for_build_with_findings(
        cfg,
        &checked.composed,
        checked.baseline.as_ref(),
        checked.model.as_ref(),
        plan::algo_release(&checked.release_version),
        verdict_for,
    );
    let is_plan_code = |c: crate::diag::Code| codes::BUILD_CODES.iter().any(|(b, _)| *b == c);
    checked.diagnostics.retain(|d| !is_plan_code(d.code));
    checked.diagnostics.extend(lowered.diagnostics);
    Some(lowered.plan)
}

/// What a request compiles to for verl's RL trainer (a test's and an example's view of
/// [`compile`] in build mode).
pub enum SpecOutcome {
    /// The spec, with the warnings of the check.
    Ok {
        spec: Box<verlc_spec::TrainerSpec>,
        checked: Box<Checked>,
    },
    /// The config has errors (the build's view: what the binary cannot bind are errors), or
    /// is not an RL config.
    Errors(Box<Checked>),
}

/// [`compile`] `req` as `verlc build` does, for an RL config.
pub fn lower_request(req: &LoadRequest) -> SpecOutcome {
    let compiled = compile(
        req,
        &CheckOptions::default(),
        Mode::Build {
            deny_warnings: false,
        },
    );
    match compiled.planned {
        Some(Planned::Rl(p)) => SpecOutcome::Ok {
            spec: Box::new(p.spec),
            checked: Box::new(compiled.checked),
        },
        _ => SpecOutcome::Errors(Box::new(compiled.checked)),
    }
}
