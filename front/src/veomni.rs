//! verl's VeOmni engine (`model_engine=veomni`, verl 0.7.1+) as the FSDP role it equals.
//!
//! verl's VeOmni engine is an FSDP2 engine with its own config sections: `<role>.veomni`
//! (engine) and VeOmni's optimizer keys in `<role>.optim`. Where its semantics are FSDP's
//! (docs/parallelism.md), the check's typed copy of such a role is rewritten into the
//! FSDP role verl would have run with the same numbers, so rules, lowering and the trainer see
//! one engine:
//! - `param_offload`, `optimizer_offload`, `seed`, `full_determinism`, `forward_only` and the
//!   entropy switches keep their meaning; `enable_fsdp_offload` is FSDP2's `offload_policy`;
//!   `ulysses_parallel_size` is `ulysses_sequence_parallel_size`.
//! - `fsdp_size` counts data-parallel ranks and VeOmni shards over the sequence-parallel ranks
//!   too: a shard group is `fsdp_size × ulysses` ranks (all of them when `fsdp_size` is -1 or
//!   covers the data-parallel size).
//! - `mixed_precision: true` (the file's default) is FSDP's default: fp32 shards, bf16 compute,
//!   fp32 gradient reductions. `false` trains everything in bf16: bf16 shards and optimizer
//!   state (`model_dtype: bf16`), bf16 compute and bf16 reduce-scatters (verl 0.9+; before, verl
//!   never passed the key on, and lowering warns that it has no effect).
//! - the optimizer `adamw` is torch's AdamW (VeOmni's others are refused by lowering); VeOmni's cosine schedule is verl's FSDP cosine with
//!   `min_lr_ratio = lr_min / lr` (half a cycle, zero-indexed steps); its constant schedule is
//!   FSDP's. VeOmni's engine never reads `lr_warmup_steps` (only the ratio), so the rewritten
//!   role warms up by the ratio alone.
//!
//! What cannot be expressed this way (expert parallelism, router replay, other optimizers, a
//! linear schedule, `lr_start`, `lr_decay_ratio`) is refused at its key by lowering
//! (`plan::veomni`); keys without a numeric effect have verdicts of their own.

use crate::codes;
use crate::diag::Diagnostic;
use crate::load::node::{Entry, Node, Scalar, Value, split_key};

/// The roles verl runs on an engine of their own: (prefix, the typed copy's FSDP section,
/// where verlc's FSDP defaults hold that section, whether the role has an optimizer).
const ROLES: [(&str, &str, &str, bool); 3] = [
    (
        "actor_rollout_ref.actor",
        "actor_rollout_ref.actor.fsdp_config",
        "actor_rollout_ref.actor.fsdp_config",
        true,
    ),
    (
        "actor_rollout_ref.ref",
        "actor_rollout_ref.ref.fsdp_config",
        "actor_rollout_ref.ref.fsdp_config",
        false,
    ),
    ("critic", "critic.fsdp", "critic.model.fsdp_config", true),
];

/// The `strategy` value of a VeOmni role.
pub const STRATEGY: &str = "veomni";

/// Whether the role at `prefix` of `root` runs verl's VeOmni engine: its strategy and its
/// `veomni` section (a `strategy: veomni` without the section is no config verl can start:
/// its VeOmni engine reads the section's keys, and build refuses it by name).
pub fn runs_veomni(root: &Node, prefix: &str) -> bool {
    root.get_path(&split_key(&format!("{prefix}.strategy")))
        .and_then(Node::as_str)
        == Some(STRATEGY)
        && root
            .get_path(&split_key(&format!("{prefix}.veomni")))
            .and_then(Node::as_map)
            .is_some()
}

/// Whether `key` is an optimizer key whose values are VeOmni's, not FSDP's (`optimizer`,
/// `lr_scheduler_type`), of a role of `root` that runs VeOmni.
pub fn holds_veomni_value(root: &Node, key: &str) -> bool {
    ROLES.iter().any(|(prefix, _, _, trained)| {
        *trained
            && key
                .strip_prefix(prefix)
                .and_then(|k| k.strip_prefix(".optim."))
                .is_some_and(|k| matches!(k, "optimizer" | "lr_scheduler_type"))
            && runs_veomni(root, prefix)
    })
}

/// Rewrites every VeOmni role of `tree` (the check's typed copy, repaired to verlc's defaults
/// where verl's files differ) into its FSDP equivalent, reading the role's settings from
/// `composed` (the tree as written); verlc's FSDP tree fills what VeOmni does not set (also
/// beside a Megatron actor, whose defaults hold no FSDP sections: the mismatch is then B010's
/// to report). Values keep the origins of the keys they come from. Returns warnings about
/// VeOmni keys the role's release ignores.
pub fn as_fsdp(tree: &mut Node, composed: &Node, release: Option<(u32, u32)>) -> Vec<Diagnostic> {
    // verl before 0.9 passed `mixed_precision` to VeOmni under a name VeOmni drops (fixed in
    // verl 0.9.0): its VeOmni runs trained with mixed precision whatever the key said.
    let honours_mixed_precision = release.is_none_or(|v| v >= (0, 9));
    let mut warnings = Vec::new();
    let world = int(composed, "trainer.nnodes")
        .unwrap_or(1)
        .saturating_mul(int(composed, "trainer.n_gpus_per_node").unwrap_or(1));
    for (prefix, fsdp_key, default_key, trained) in ROLES {
        if !runs_veomni(composed, prefix) {
            continue;
        }
        let engine = format!("{prefix}.veomni");
        let at = |k: &str| composed.get_path(&split_key(&format!("{engine}.{k}")));
        let mut set: Vec<(&str, Node)> = Vec::new();
        for (from, to) in [
            ("param_offload", "param_offload"),
            ("optimizer_offload", "optimizer_offload"),
            ("enable_fsdp_offload", "offload_policy"),
            ("ulysses_parallel_size", "ulysses_sequence_parallel_size"),
            ("seed", "seed"),
            ("full_determinism", "full_determinism"),
            ("forward_only", "forward_only"),
            (
                "entropy_from_logits_with_chunking",
                "entropy_from_logits_with_chunking",
            ),
            ("entropy_checkpointing", "entropy_checkpointing"),
            ("use_torch_compile", "use_torch_compile"),
        ] {
            if let Some(n) = at(from).filter(|n| matches!(n.value, Value::Scalar(_))) {
                set.push((to, n.clone()));
            }
        }
        if let Some(n) = at("fsdp_size") {
            let ulysses = at("ulysses_parallel_size")
                .and_then(Node::as_i64)
                .unwrap_or(1)
                .max(1);
            let size = shard_group(n.as_i64().unwrap_or(-1), ulysses, world);
            set.push((
                "fsdp_size",
                Node::scalar(Scalar::Int(size), n.origin.clone()),
            ));
        }
        set.push(("strategy", Node::scalar(Scalar::Str("fsdp2".into()), None)));
        // `mixed_precision: false`: no mixed-precision policy at all, the model in bf16.
        let mixed_off = at("mixed_precision").filter(|n| n.as_bool() == Some(false));
        if let Some(n) = mixed_off.filter(|_| !honours_mixed_precision) {
            let key = format!("{engine}.mixed_precision");
            warnings.push(
                Diagnostic::warning(
                    codes::BUILD_NO_EFFECT,
                    format!("`{key}: false` has no effect before verl 0.9: verl passed it to VeOmni under a name VeOmni drops, so the role trains with mixed precision (fp32 weights, bf16 compute), as verlc's trainer does"),
                )
                .with_key(key)
                .with_primary(n.origin.clone(), "has no effect"),
            );
        }
        if let Some(n) = mixed_off.filter(|_| honours_mixed_precision) {
            let bf16 = || Node::scalar(Scalar::Str("bf16".into()), n.origin.clone());
            set.push(("model_dtype", bf16()));
            let mut mp = Node::empty_map(n.origin.clone());
            for k in ["param_dtype", "reduce_dtype", "buffer_dtype"] {
                insert(&mut mp, k, bf16());
            }
            set.push(("mixed_precision", mp));
        }
        let fsdp_path = split_key(fsdp_key);
        // Built (once per process) only for a config with a VeOmni role.
        let defaults = crate::load::compose::builtin_tree(crate::config::Flavour::Fsdp);
        if tree.get_path(&fsdp_path).and_then(Node::as_map).is_none()
            && let Some(d) = defaults.get_path(&split_key(default_key))
            && let Some((last, parent)) = fsdp_path.split_last()
            && let Some(p) = ensure_map(tree, &parent.join("."))
        {
            insert(p, last, d.clone());
        }
        let Some(section) = ensure_map(tree, fsdp_key) else {
            continue;
        };
        for (k, n) in set {
            insert(section, k, n);
        }
        let strategy = composed
            .get_path(&split_key(&format!("{prefix}.strategy")))
            .and_then(|n| n.origin.clone());
        if let Some(role) = ensure_map(tree, prefix) {
            insert(
                role,
                "strategy",
                Node::scalar(Scalar::Str("fsdp2".into()), strategy),
            );
            if let Some(m) = role.as_map_mut() {
                m.swap_remove("veomni");
            }
        }
        if trained {
            optim_as_fsdp(tree, composed, &format!("{prefix}.optim"));
        }
    }
    warnings
}

/// VeOmni's optimizer keys in FSDP's terms (see the module docs). Values VeOmni has and FSDP
/// lacks are dropped from the typed copy; lowering refuses those that are not VeOmni's
/// defaults.
fn optim_as_fsdp(tree: &mut Node, composed: &Node, key: &str) {
    let at = |k: &str| composed.get_path(&split_key(&format!("{key}.{k}")));
    let lr = at("lr").and_then(Node::as_f64);
    let lr_min = at("lr_min").and_then(Node::as_f64).unwrap_or(0.0);
    let min_ratio = match lr {
        Some(lr) if lr > 0.0 => lr_min / lr,
        _ => 0.0,
    };
    let origin = |k: &str| at(k).and_then(|n| n.origin.clone());
    let Some(optim) = ensure_map(tree, key) else {
        return;
    };
    // VeOmni's `adamw` is torch's AdamW; lowering refuses its other optimizers at the key
    // (torch.optim's names do not apply to VeOmni's).
    insert(
        optim,
        "optimizer",
        Node::scalar(Scalar::Str("AdamW".into()), origin("optimizer")),
    );
    if let Some(m) = optim.as_map_mut() {
        m.swap_remove("optimizer_impl");
    }
    if at("lr_scheduler_type").and_then(Node::as_str) == Some("cosine") {
        insert(
            optim,
            "lr_scheduler_type",
            Node::scalar(Scalar::Str("cosine".into()), origin("lr_scheduler_type")),
        );
        insert(
            optim,
            "min_lr_ratio",
            Node::scalar(Scalar::Float(min_ratio), origin("lr_min")),
        );
        insert(optim, "num_cycles", Node::scalar(Scalar::Float(0.5), None));
        insert(
            optim,
            "zero_indexed_step",
            Node::scalar(Scalar::Bool(true), None),
        );
    } else {
        insert(
            optim,
            "lr_scheduler_type",
            Node::scalar(Scalar::Str("constant".into()), origin("lr_scheduler_type")),
        );
    }
    insert(
        optim,
        "lr_warmup_steps",
        Node::scalar(Scalar::Int(-1), origin("lr_warmup_steps")),
    );
    // VeOmni's engine never reads `override_optimizer_config` (lowering warns when it is set).
    if let Some(m) = optim.as_map_mut() {
        for k in [
            "lr_min",
            "lr_start",
            "lr_decay_ratio",
            "override_optimizer_config",
        ] {
            m.swap_remove(k);
        }
    }
}

/// FSDP's shard-group size (`fsdp_size`, -1 for every rank) of VeOmni's `fsdp_size` over the
/// data-parallel ranks, with `ulysses` sequence-parallel ranks each.
pub fn shard_group(fsdp_size: i64, ulysses: i64, world: i64) -> i64 {
    let dp = world / ulysses.max(1);
    if fsdp_size < 0 || fsdp_size >= dp {
        -1
    } else {
        fsdp_size.saturating_mul(ulysses)
    }
}

fn int(root: &Node, key: &str) -> Option<i64> {
    root.get_path(&split_key(key)).and_then(Node::as_i64)
}

/// The map at `key`, created (with its parents) where missing.
fn ensure_map<'t>(tree: &'t mut Node, key: &str) -> Option<&'t mut Node> {
    let mut node = tree;
    for seg in split_key(key) {
        let map = node.as_map_mut()?;
        if map.get(seg).is_none_or(|e| e.node.as_map().is_none()) {
            map.insert(
                seg.to_owned(),
                Entry {
                    key_origin: None,
                    node: Node::empty_map(None),
                },
            );
        }
        node = &mut map.get_mut(seg)?.node;
    }
    Some(node)
}

fn insert(map: &mut Node, key: &str, node: Node) {
    if let Some(m) = map.as_map_mut() {
        match m.get_mut(key) {
            Some(e) => e.node = node,
            None => {
                m.insert(
                    key.to_owned(),
                    Entry {
                        key_origin: None,
                        node,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shard_group;

    #[test]
    fn veomni_shard_groups_span_the_sequence_parallel_ranks() {
        // 8 ranks, SP 2: 4 data-parallel ranks.
        assert_eq!(shard_group(-1, 2, 8), -1);
        assert_eq!(shard_group(4, 2, 8), -1, "fsdp_size covers the 4 DP ranks");
        assert_eq!(shard_group(2, 2, 8), 4, "2 DP ranks x 2 SP ranks");
        assert_eq!(shard_group(2, 1, 8), 2);
        assert_eq!(shard_group(16, 1, 16), -1);
    }
}
