//! ## What it checks
//! Every deprecated or renamed key of verl that the config sets (the table is
//! `config::DEPRECATED_KEYS`): the global micro-batch sizes (`ppo_micro_batch_size`,
//! `log_prob_micro_batch_size`, `micro_batch_size`, `forward_micro_batch_size`),
//! `optim.warmup_style`, `optim.grad_clip`, the role-level `ulysses_sequence_parallel_size`,
//! `rollout.mode`, `reward_model.reward_manager`, `data.val_batch_size` and
//! `trainer.remove_previous_ckpt_in_save`. A key counts as set when it holds something other
//! than its default (null, `async`, `naive`, 1) and was not filled in by an interpolation.
//!
//! ## Why
//! verl still accepts these keys but warns, ignores them, or copies them to their new place;
//! they are on their way out. The role-level Ulysses size is reported only with the engine
//! workers (`trainer.use_legacy_worker_impl: disable`): the legacy workers read the
//! role-level key and ignore `fsdp_config.ulysses_sequence_parallel_size`.
//!
//! ## Example
//! ```yaml
//! actor_rollout_ref:
//!   actor:
//!     optim:
//!       warmup_style: cosine
//! ```
//!
//! ## Fix
//! Move the value to the key named in the warning (`optim.lr_scheduler_type: cosine` above),
//! or remove the key.

use crate::config::DEPRECATED_KEYS;
use crate::diag::{Code, Diagnostic};
use crate::load::node::{Node, Scalar, Value};
use crate::rules::RuleContext;
use crate::rules::facts::new_engine;

const CODE: Code = Code("V038");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    for entry in DEPRECATED_KEYS {
        let mut found = Vec::new();
        expand(
            ctx.root,
            &entry.path.split('.').collect::<Vec<_>>(),
            &mut Vec::new(),
            &mut found,
        );
        for (path, node) in found {
            if !is_set(&path, node) {
                continue;
            }
            if path.ends_with(".ulysses_sequence_parallel_size") && !new_engine(ctx.config) {
                continue; // the legacy workers read exactly this key
            }
            let help = match entry.replacement_for(&path) {
                Some(new) => format!("use `{new}` instead"),
                None => format!("remove `{path}`"),
            };
            out.push(
                Diagnostic::warning(CODE, format!("`{path}` is deprecated: {}", entry.note))
                    .with_key(path.clone())
                    .with_primary(node.origin.clone(), "deprecated key set here")
                    .with_help(help),
            );
        }
    }
}

/// Every concrete path matching `pattern` (`*` matches one key) with its node.
fn expand<'a>(
    node: &'a Node,
    pattern: &[&str],
    prefix: &mut Vec<String>,
    found: &mut Vec<(String, &'a Node)>,
) {
    let Some((head, rest)) = pattern.split_first() else {
        found.push((prefix.join("."), node));
        return;
    };
    let Some(map) = node.as_map() else { return };
    for (key, entry) in map {
        if *head != "*" && head != key {
            continue;
        }
        prefix.push(key.clone());
        expand(&entry.node, rest, prefix, found);
        prefix.pop();
    }
}

/// Whether a deprecated key holds a value of its own: not its neutral default, not a copy
/// made by an interpolation.
fn is_set(path: &str, node: &Node) -> bool {
    if node.via.is_some() {
        return false;
    }
    let neutral = match &node.value {
        Value::Scalar(Scalar::Null) => true,
        Value::Scalar(Scalar::Str(s)) if path.ends_with("rollout.mode") => {
            s == "async" || s == "sync"
        }
        Value::Scalar(Scalar::Str(s)) if path == "reward_model.reward_manager" => s == "naive",
        Value::Scalar(Scalar::Int(1)) if path.ends_with("ulysses_sequence_parallel_size") => true,
        _ => false,
    };
    !neutral
}
