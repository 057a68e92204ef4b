//! How each parameter of the decoder splits over tensor-parallel ranks, and what its gradient
//! is on a rank: the model states it, by the names its layers register, so the engines and the
//! parallel layer ask here and name no parameter of any family. A new family whose layers add
//! parameters states them in this file.

use super::ModelConfig;

/// How a tensor is split over the tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardSpec {
    /// Every rank holds all of it.
    Replicated,
    /// Split into equal parts along `dim` (0: column-parallel, 1: row-parallel weight).
    Dim(i64),
    /// Split by vocabulary rows (dim 0), the last part padded with zero rows.
    Vocab,
    /// Dim 0 made of consecutive sections of these sizes, each split into equal parts; a
    /// rank holds its part of every section, in order (a Gated DeltaNet's fused q/k/v
    /// projection and convolution channels).
    Sections([i64; 3]),
}

/// The split of a checkpoint tensor under Megatron's layout, by the name the decoder registers
/// it under (a Gated DeltaNet's fused projections need the model's sizes: [`shard_spec`]).
pub fn checkpoint_shard_spec(name: &str) -> ShardSpec {
    const COLUMN: [&str; 8] = [
        "q_proj",
        "k_proj",
        "v_proj",
        "gate_proj",
        "up_proj",
        "in_proj_z",
        "in_proj_b",
        "in_proj_a",
    ];
    const ROW: [&str; 3] = ["o_proj", "down_proj", "out_proj"];
    // A vision-language model's tower is whole on every tensor-parallel rank (its linear
    // layers share names with the text model's).
    if name.starts_with("visual.") {
        return ShardSpec::Replicated;
    }
    let Some((module, leaf)) = name.rsplit_once('.') else {
        return ShardSpec::Replicated;
    };
    let layer = module.rsplit('.').next().unwrap_or(module);
    match (layer, leaf) {
        ("embed_tokens" | "lm_head", "weight") => ShardSpec::Vocab,
        (l, _) if COLUMN.contains(&l) => ShardSpec::Dim(0),
        (l, "weight") if ROW.contains(&l) => ShardSpec::Dim(1),
        // A DeltaNet's per-value-head decay parameters, and per-head attention sinks.
        ("linear_attn", "dt_bias" | "A_log") | ("self_attn", "sinks") => ShardSpec::Dim(0),
        _ => ShardSpec::Replicated,
    }
}

/// [`checkpoint_shard_spec`] with the model's sizes: a Gated DeltaNet's `in_proj_qkv` and `conv1d`
/// hold the query, key and value channels one after the other, split head-wise each.
pub fn shard_spec(cfg: &ModelConfig, name: &str) -> ShardSpec {
    let fused = name.ends_with("linear_attn.in_proj_qkv.weight")
        || name.ends_with("linear_attn.conv1d.weight");
    if fused {
        let l = &cfg.linear;
        let key = l.linear_num_key_heads * l.linear_key_head_dim;
        return ShardSpec::Sections([key, key, l.value_dim()]);
    }
    checkpoint_shard_spec(name)
}

/// A routed expert's parameter (`…mlp.experts.<e>.…`): held by the ranks of its expert-parallel
/// group, whole or split over tensor-parallel ranks as the layout says.
pub fn is_routed_expert_param(name: &str) -> bool {
    name.contains(".mlp.experts.")
}

/// What a parameter's gradient on one tensor-parallel rank is, before the engine's reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TpGradient {
    /// A per-head norm (queries', keys', a Gated DeltaNet's gated norm): each rank sees its
    /// heads only, so its gradient is partial.
    pub per_head: bool,
    /// Applied to the residual stream (layer norms, the final norm, a row-parallel layer's
    /// bias): under sequence parallelism each rank sees its chunk of the sequence.
    pub on_sequence_chunks: bool,
    /// A router's (or the shared expert's gate's) weight: the router's logits weigh each rank's
    /// partial expert outputs, so its gradient is partial on every rank.
    pub router: bool,
    /// A routed expert's parameter ([`is_routed_expert_param`]).
    pub routed_expert: bool,
    /// A vision tower's: the tower runs whole on every rank on the whole sequence, its
    /// gradients are whole already.
    pub vision_tower: bool,
}

/// [`TpGradient`] of the parameter `name`.
pub fn tp_gradient(name: &str) -> TpGradient {
    let routed_expert = is_routed_expert_param(name);
    TpGradient {
        per_head: name.ends_with("q_norm.weight")
            || name.ends_with("k_norm.weight")
            || name.ends_with("linear_attn.norm.weight"),
        // (A routed expert's down-projection bias follows its expert.)
        on_sequence_chunks: name.ends_with("layernorm.weight")
            || name == "model.norm.weight"
            || name.ends_with("o_proj.bias")
            || (name.ends_with("down_proj.bias") && !routed_expert),
        router: name.ends_with("mlp.gate.weight")
            || name.ends_with("mlp.router.weight")
            || name.ends_with("mlp.router.bias")
            || name.ends_with("mlp.shared_expert_gate.weight"),
        routed_expert,
        vision_tower: name.starts_with("visual."),
    }
}
