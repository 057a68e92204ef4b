//! ## What it checks
//! On the config tree of a verl release newer than 0.7.0 (a `--config-dir` of 0.7.1 or later),
//! every key the config sets that verl moved or dropped by that release (the table is
//! `migrate::MOVES`): the reward keys that 0.7.1 moved under `reward.*`,
//! `rollout.update_weights_bucket_megabytes` (0.9: `rollout.checkpoint_engine.*`),
//! `rollout.skip_rollout` (0.9: `skip.rollout.*`), `trainer.use_legacy_worker_impl` (dropped
//! in 0.8) and others.
//!
//! ## Why
//! A key the newer tree no longer has makes verl fail at start-up when it turns the section
//! into its dataclass (an unknown field): an error. A key the newer tree keeps as a legacy
//! stub (the top-level `reward_model`, `custom_reward_function` and `sandbox_fusion` of 0.7.1+)
//! is a warning on 0.7.1 and 0.8, which move it over `reward` at start-up, and an error from
//! 0.9.0, which never reads it (the run would silently use the default). A key of the plain
//! `trainer` mapping (ignored) is a warning. Either way the value belongs at its new key. Each
//! move is dated to the patch release whose tree dropped the key (`megatron.grad_offload`:
//! 0.9.1; verl 0.9.0 still reads it).
//!
//! ## Example
//! ```yaml
//! # composed on verl 0.9.1's config tree
//! actor_rollout_ref:
//!   rollout:
//!     update_weights_bucket_megabytes: 1024
//! ```
//!
//! ## Fix
//! Move the value to the key the diagnostic names (here
//! `actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes`);
//! `verlc migrate CONFIG [OVERRIDES]` rewrites a file and its overrides.

use crate::diag::{Code, Diagnostic};
use crate::load::moves::{MOVES, destination};
use crate::load::node::Node;
use crate::rules::RuleContext;

const CODE: Code = Code("V059");

/// Every path under `node` (its leaves, dotted, after `prefix`) with its node.
fn leaves<'a>(node: &'a Node, prefix: &str, out: &mut Vec<(String, &'a Node)>) {
    match node.as_map() {
        Some(map) if !map.is_empty() => {
            for (k, e) in map {
                leaves(&e.node, &format!("{prefix}.{k}"), out);
            }
        }
        _ => out.push((prefix.to_owned(), node)),
    }
}

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    // Only on a newer release's tree: verlc's own tree is 0.7.0's, where these keys live.
    let Some(release) = ctx.release else { return };
    let mut seen: Vec<String> = Vec::new();
    for m in MOVES {
        if Some(release) < crate::load::version::release_triple(m.release) {
            continue;
        }
        let base = m.from.trim_end_matches(".*");
        let Some(node) = ctx.root.get_path(&base.split('.').collect::<Vec<_>>()) else {
            continue;
        };
        let mut found = Vec::new();
        if m.from.ends_with(".*") {
            leaves(node, base, &mut found);
            found.retain(|(p, _)| p != base);
        } else {
            found.push((base.to_owned(), node));
        }
        for (path, node) in found {
            if node.is_null() || node.via.is_some() || seen.contains(&path) {
                continue;
            }
            // A key this release's own tree sets is one of its keys (verl's main branch kept
            // the top-level `reward_manager` after 0.7.1): only the stubs it leaves null, and
            // keys it lacks, are the 0.7.0 layout's.
            let segs: Vec<&str> = path.split('.').collect();
            if ctx
                .defaults
                .and_then(|d| d.get_path(&segs))
                .is_some_and(|d| !d.is_null())
            {
                continue;
            }
            // The move that decides this key (a more specific one may come first).
            let Some((decisive, to)) = destination(&path) else {
                continue;
            };
            if !std::ptr::eq(decisive, m) {
                continue;
            }
            // The newer trees hold none of these keys but the legacy reward stubs, which are
            // null there: a value is the user's.
            seen.push(path.clone());
            let (mut what, help) = match &to {
                Some(to) => (
                    format!("moved to `{to}` in verl {}", m.release),
                    format!("set `{to}` instead; `verlc migrate` rewrites the config"),
                ),
                None => (
                    format!("dropped in verl {}: {}", m.release, m.note),
                    format!("remove `{path}`; `verlc migrate` does"),
                ),
            };
            let fatal = m.fatal(release);
            if fatal
                && m.from.split('.').next().is_some_and(|top| {
                    ["reward_model", "custom_reward_function", "sandbox_fusion"].contains(&top)
                })
            {
                what.push_str(
                    " (verl 0.9 keeps the old key as a stub it never reads: the run would use the default instead)",
                );
            }
            let d = if !fatal {
                Diagnostic::warning(
                    CODE,
                    format!("`{path}` belongs to verl 0.7.0's layout: {what}"),
                )
            } else {
                Diagnostic::error(
                    CODE,
                    format!("`{path}` is not a key of this verl release: {what}"),
                )
            };
            out.push(
                d.with_key(path.clone())
                    .with_primary(node.origin.clone(), "set here")
                    .with_help(help),
            );
        }
    }
}
