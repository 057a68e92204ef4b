//! ## What it checks
//! Every model address of the config that is verlc's `builtin://` scheme (a model, tokenizer,
//! critic, reward model or teacher path): the built-in model must exist (`tiny`), take the
//! parameters given, build the family `arch` names, and get whole numbers where it counts.
//!
//! ## Why
//! The trainer builds the model from the address when its ranks start; an address it cannot
//! build would pass `check` and `build` and fail there.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   model:
//!     path: builtin://tiny?arch=gemma3
//! ```
//!
//! ## Fix
//! Use a family the tiny model builds (the message lists them), or a checkpoint of that
//! family.

use crate::diag::{Code, Diagnostic};
use crate::load::node::Node;
use crate::rules::RuleContext;

const CODE: Code = Code("V063");

/// Keys whose value names a model or tokenizer (their last segment).
fn names_a_model(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    last == "path" || last == "model_path" || last == "tokenizer_path"
}

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let mut found = Vec::new();
    walk(ctx.root, &mut String::new(), &mut found);
    // One diagnostic per written address: keys that take their value by interpolation
    // (`critic.model.tokenizer_path: ${...model.path}`) share the origin of the one they copy.
    let mut reported: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    for (key, path) in found {
        if let Some(problem) = verlc_spec::builtin::model_problem(&path) {
            let origin = ctx.origin(&key);
            if let Some(o) = &origin {
                let at = (o.source.0 as usize, o.span.clone());
                if reported.contains(&at) {
                    continue;
                }
                reported.push(at);
            }
            out.push(
                Diagnostic::error(CODE, problem)
                    .with_key(key.clone())
                    .with_primary(origin, "this address")
                    .with_help(format!(
                        "`builtin://tiny` builds {} (`arch=`), with {}",
                        verlc_spec::families::tiny_archs().join(", "),
                        verlc_spec::builtin::TINY_PARAMS.join(", ")
                    )),
            );
        }
    }
}

/// Every string leaf under `node` whose key names a model and whose value is a `builtin://`
/// address.
fn walk(node: &Node, key: &mut String, out: &mut Vec<(String, String)>) {
    if let Some(map) = node.as_map() {
        for (k, e) in map {
            let len = key.len();
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(k);
            walk(&e.node, key, out);
            key.truncate(len);
        }
    } else if let Some(s) = node.as_str()
        && s.starts_with(verlc_spec::builtin_uri::SCHEME)
        && names_a_model(key)
    {
        out.push((key.clone(), s.to_owned()));
    }
}
