//! Whether the model splits at the rollout's tensor parallel size on a Megatron actor (when
//! its `config.json` is at hand): the rollout runs Megatron's layers at that size, which split
//! the attention heads, the key/value heads (never replicated, unlike vLLM's) and the MLP's
//! intermediate size into equal parts.
use verlc_spec::TrainerSpec;

use crate::codes;
use crate::diag::Diagnostic;
use crate::load::node::{Node, split_key};
use crate::rules::ModelDims;

const KEY: &str = "actor_rollout_ref.rollout.tensor_model_parallel_size";

/// A `B018` error at the rollout's TP key when `model` does not split `r` ways.
pub fn rollout_fit(spec: &TrainerSpec, model: &ModelDims, root: &Node) -> Option<Diagnostic> {
    let r = spec.rollout.tensor_parallel? as u64;
    let parts = [
        ("attention heads", Some(model.num_attention_heads)),
        ("key/value heads", Some(model.kv_heads())),
        ("intermediate size", model.intermediate_size),
    ];
    let bad: Vec<String> = parts
        .iter()
        .filter_map(|(what, n)| n.filter(|n| n % r != 0).map(|n| format!("{n} {what}")))
        .collect();
    if bad.is_empty() {
        return None;
    }
    let sizes: Vec<String> = (1..=model.kv_heads().min(1 << 12))
        .filter(|d| parts.iter().all(|(_, n)| n.is_none_or(|n| n % d == 0)))
        .map(|d| d.to_string())
        .collect();
    let origin = root
        .get_path(&split_key(KEY))
        .and_then(|n| n.origin.clone());
    Some(
        Diagnostic::error(
            codes::BUILD_UNSUPPORTED_SETTING,
            format!(
                "the rollout cannot run at tensor parallel {r} on this model: {} cannot be split {r} ways (the rollout of a Megatron actor runs Megatron's layers, which do not replicate key/value heads)",
                bad.join(", ")
            ),
        )
        .with_key(KEY)
        .with_primary(origin, "set here")
        .with_help(format!("use a size that splits them: {}", sizes.join(", "))),
    )
}
