//! `builtin://tiny`: a small Qwen2-style decoder, randomly initialised from a seed, paired with
//! the character-level tokenizer of [`crate::tokenizer::builtin`]; it needs no files and is
//! sized for the built-in synthetic tasks (quickstart: GRPO on digit reversal, on CPU).
//!
//! Parameters (all optional): `layers` (4), `hidden` (128), `heads` (4), `kv_heads` (2),
//! `intermediate` (384), `max_positions` (256), e.g. `builtin://tiny?layers=2&hidden=64`;
//! `arch` (`qwen2`, or any other `tiny_arch` of `verlc_spec::families`) picks the family, and for `qwen3_moe`
//! `experts` (8), `experts_per_tok` (2) and `moe_intermediate` (hidden / 2) size the sparse
//! MLPs (`builtin://tiny?arch=qwen3_moe`). `qwen3_5` is Qwen3.5's text model: with the
//! default 4 layers, three Gated DeltaNet layers then one gated full-attention layer;
//! `qwen3_5_moe` the same with every MLP sparse (`experts` and so on) plus a shared expert
//! of width `moe_intermediate`; `qwen3_next` Qwen3-Next, the layers of `qwen3_5_moe` (its
//! checkpoints store the DeltaNet projections fused); `qwen2_5_vl` Qwen2.5-VL, the `qwen2`
//! text model under multimodal rotary positions with a two-block vision tower, its tokenizer
//! gaining Qwen-VL's vision tokens; `qwen3_vl` Qwen3-VL, the `qwen3` text model under
//! interleaved M-RoPE with a two-block tower whose first block gives DeepStack features;
//! `qwen3_vl_moe` the same with `qwen3_moe`'s sparse MLPs; `qwen3_5_vl` and `qwen3_5_moe_vl`
//! Qwen3.5's image-text checkpoints, the `qwen3_5` / `qwen3_5_moe` text model under interleaved
//! M-RoPE with a two-block tower without DeepStack.
//! `tools` (`tools=lookup`, a comma list) adds one token per tool
//! to the vocabulary: its whole argument-less `hermes` call (the tool task of
//! `examples/tool_lookup.yaml`).

use serde_json::{Map, json};

use crate::builtin_uri::BuiltinUri;
use crate::tokenizer::builtin as tok;

use super::{Arch, LinearAttentionConfig, ModelConfig, MoeConfig};

/// The names `builtin://` models accept.
pub use verlc_spec::builtin::BUILTIN_MODELS as MODELS;

/// The config of a built-in model.
pub fn config(uri: &BuiltinUri) -> Result<ModelConfig, String> {
    if uri.name == "scaled" {
        return scaled(uri);
    }
    if uri.name != "tiny" {
        return Err(format!(
            "unknown builtin model `{}` (known: {})",
            uri.name,
            MODELS.join(", ")
        ));
    }
    if let Some(e) = verlc_spec::builtin::tiny_problem(uri, "builtin://tiny") {
        return Err(e);
    }
    let tools: String = uri.get("tools", String::new())?;
    let hidden: i64 = uri.get("hidden", 128)?;
    let arch_name: String = uri.get("arch", verlc_spec::builtin::TINY_DEFAULT_ARCH.to_owned())?;
    let row = verlc_spec::families::of_tiny_arch(&arch_name);
    let model_type = row.map_or(arch_name.clone(), |r| r.model_type.to_owned());
    let shared = row.is_some_and(|r| r.shared_expert);
    let moe = if row.is_some_and(|r| r.experts) {
        MoeConfig {
            num_experts: uri.get("experts", 8)?,
            num_experts_per_tok: uri.get("experts_per_tok", 2)?,
            moe_intermediate_size: uri.get("moe_intermediate", hidden / 2)?,
            norm_topk_prob: true,
            shared_expert_intermediate_size: if shared {
                uri.get("moe_intermediate", hidden / 2)?
            } else {
                0
            },
            ..MoeConfig::default()
        }
    } else {
        MoeConfig::default()
    };
    let mut extra = Map::new();
    let vision_tokens = tok::vision_tokens(&arch_name);
    let mut cfg = ModelConfig {
        model_type,
        vocab_size: (tok::vocab_size() + vision_tokens.len() + tok::tool_call_tokens(&tools).len())
            as i64,
        hidden_size: hidden,
        intermediate_size: uri.get("intermediate", 3 * hidden)?,
        num_hidden_layers: uri.get("layers", 4)?,
        num_attention_heads: uri.get("heads", 4)?,
        num_key_value_heads: Some(uri.get("kv_heads", 2)?),
        head_dim: None,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: None,
        max_position_embeddings: uri.get("max_positions", 256)?,
        tie_word_embeddings: true,
        attention_bias: None,
        mlp_bias: false,
        hidden_act: "silu".into(),
        initializer_range: 0.02,
        use_sliding_window: false,
        moe,
        partial_rotary_factor: None,
        linear: LinearAttentionConfig::default(),
        lora: None,
        extra: Map::new(),
    };
    // The family's character where its config class differs from the common defaults:
    // its activation and q/k/v biases (dropouts stay off: see below).
    for (key, value) in row.map_or(&[][..], |r| r.config_defaults) {
        use verlc_spec::families::ConfigValue;
        match (*key, *value) {
            ("hidden_act", ConfigValue::Str(act)) => cfg.hidden_act = act.to_owned(),
            // A family naming its activation by another key (saved under it too).
            (k, ConfigValue::Str(act)) if row.is_some_and(|r| r.activation_key == k) => {
                cfg.hidden_act = act.to_owned();
                extra.insert(k.to_owned(), json!(act));
            }
            // Soft caps as the family's config class has them.
            (k @ ("attn_logit_softcapping" | "final_logit_softcapping"), ConfigValue::Float(c)) => {
                extra.insert(k.to_owned(), json!(c));
            }
            ("attention_bias", ConfigValue::Bool(b)) => cfg.attention_bias = Some(b),
            _ => {}
        }
    }
    if row.is_some_and(|r| r.sliding_layers) {
        // Short enough that the quickstart's prompts outgrow it; `normalize` gives the
        // family's `layer_types`.
        let window: i64 = uri.get("window", 8)?;
        extra.insert("sliding_window".into(), json!(window));
        cfg = cfg.normalize()?;
    }
    if row.is_some_and(|r| r.soft_capping) {
        // The attention scale of plain attention, as Gemma 2's 2B and 9B have it.
        extra.insert(
            "query_pre_attn_scalar".into(),
            json!(hidden / cfg.num_attention_heads.max(1)),
        );
    }
    if row.is_some_and(|r| r.expert_style.biased()) {
        // That family's config class reads the experts' width as `intermediate_size` (and their
        // count as `num_local_experts`, which saving writes).
        cfg.intermediate_size = cfg.moe.moe_intermediate_size;
        extra.insert("swiglu_limit".into(), json!(7.0));
    }
    if row.is_some_and(|r| r.linear_attention) {
        // Sized so its Gated DeltaNet heads match the attention heads'. The family's layer
        // mix and rotated share as its config keys set them, for studying a tiny run.
        let head = hidden / cfg.num_attention_heads.max(1);
        cfg.head_dim = Some(head);
        // In the config now, for `normalize` below to lay out the layers, and in the saved
        // keys (`extra` replaces the config's at the end).
        let every: i64 = uri.get("full_attention_interval", 4)?;
        extra.insert("full_attention_interval".into(), json!(every));
        cfg.extra
            .insert("full_attention_interval".into(), json!(every));
        cfg.partial_rotary_factor = Some(uri.get("partial_rotary_factor", 0.25)?);
        cfg.linear = LinearAttentionConfig {
            linear_key_head_dim: head,
            linear_value_head_dim: head,
            linear_num_key_heads: cfg.num_key_value_heads.unwrap_or(2),
            linear_num_value_heads: cfg.num_attention_heads,
            ..LinearAttentionConfig::default()
        };
        cfg = cfg.normalize()?;
    }
    let arch: Arch = cfg.arch()?;
    if arch.has_vision() {
        // `deepstack`: how many decoder layers take Qwen3-VL's DeepStack features (1 or 2).
        let deepstack: usize = uri.get("deepstack", 1)?;
        add_vision_tower(&mut cfg, &mut extra, arch, deepstack);
    }
    extra.insert("architectures".into(), json!([arch.causal_lm_class()]));
    extra.insert("bos_token_id".into(), json!(null));
    extra.insert("eos_token_id".into(), json!(tok::EOS_ID));
    extra.insert("pad_token_id".into(), json!(tok::PAD_ID));
    extra.insert("torch_dtype".into(), json!("float32"));
    extra.insert("attention_dropout".into(), json!(0.0));
    if row.is_some_and(|r| r.config_default("residual_dropout").is_some()) {
        // Written, so that a saved checkpoint does not reload with the config class's 0.1.
        extra.insert("residual_dropout".into(), json!(0.0));
    }
    cfg.extra = extra;
    cfg.validate()?;
    Ok(cfg)
}

/// A tiny vision-language model's vision half: M-RoPE sections for its heads (interleaved for
/// Qwen3-VL and Qwen3.5), the tiny tower ([`set_tiny_tower`]) on 14-pixel patches (so the
/// default image processor feeds it), and the vision token ids after the built-in vocabulary.
fn add_vision_tower(
    cfg: &mut ModelConfig,
    extra: &mut Map<String, serde_json::Value>,
    arch: Arch,
    deepstack: usize,
) {
    let qwen3 = arch.tower().is_some_and(|t| t.qwen3_style());
    let mut rope = Map::new();
    // As each family's published configs name it.
    if qwen3 {
        rope.insert("rope_type".into(), json!("default"));
    } else {
        rope.insert("type".into(), json!("mrope"));
    }
    rope.insert("mrope_section".into(), tiny_mrope_section(cfg));
    if qwen3 {
        rope.insert("mrope_interleaved".into(), json!(true));
    }
    cfg.rope_scaling = Some(rope);
    let mut vision = Map::new();
    let common = [
        ("patch_size", json!(14)),
        ("temporal_patch_size", json!(2)),
        ("in_channels", json!(3)),
        ("spatial_merge_size", json!(2)),
        ("model_type", json!(tower_model_type(arch))),
    ];
    let family: &[(&str, serde_json::Value)] = if qwen3 {
        &[
            ("hidden_act", json!("gelu_pytorch_tanh")),
            ("num_position_embeddings", json!(64)),
        ]
    } else {
        &[
            ("window_size", json!(112)),
            ("hidden_act", json!("silu")),
            ("tokens_per_second", json!(2)),
        ]
    };
    for (key, value) in common.iter().chain(family) {
        vision.insert((*key).into(), value.clone());
    }
    set_tiny_tower(&mut vision, cfg.hidden_size, arch, deepstack);
    extra.insert("vision_config".into(), serde_json::Value::Object(vision));
    let base = tok::vocab_size() as i64;
    for (i, key) in [
        "vision_start_token_id",
        "vision_end_token_id",
        "image_token_id",
        "video_token_id",
    ]
    .iter()
    .enumerate()
    {
        extra.insert((*key).into(), json!(base + i as i64));
    }
}

/// `builtin://scaled?from=DIR`: a stand-in for the model whose `config.json` is in `DIR`, of
/// the same family, vocabulary (up to the last id of `DIR`'s tokenizer: a checkpoint's padding
/// rows are dropped), special token ids, rotary settings and embedding tying, scaled
/// down to `layers` (2; at least one of each layer kind: a Gated DeltaNet and a full-attention
/// layer, a dense and a sparse MLP where the model mixes them), `hidden` (64), `heads` (4),
/// `kv_heads` (2, or `heads` when the model has as many key/value heads as query heads),
/// `intermediate` (2 x hidden) and `experts` (4, or the top-k when it is larger). Randomly
/// initialised like `tiny`; what `verlc smoke` runs a user's model as. A vision-language
/// model's tower is scaled down too, keeping the patch sizes its image processor feeds.
fn scaled(uri: &BuiltinUri) -> Result<ModelConfig, String> {
    uri.check_keys(verlc_spec::builtin::SCALED_PARAMS)?;
    let from: String = uri.get("from", String::new())?;
    if from.is_empty() {
        return Err("`builtin://scaled` needs `from=<model dir>`".to_owned());
    }
    let file = std::path::Path::new(&from).join("config.json");
    let orig = ModelConfig::from_file(&file)
        .map_err(|e| e.to_string())?
        .normalize()?;
    let arch = orig.arch()?;
    let hidden: i64 = uri.get("hidden", 64)?;
    let heads: i64 = uri.get("heads", 4)?;
    let mha = orig.kv_heads() == orig.num_attention_heads;
    let kv_heads: i64 = uri.get("kv_heads", if mha { heads } else { 2.min(heads) })?;
    let head = hidden / heads.max(1);
    let mut cfg = orig.clone();
    cfg.hidden_size = hidden;
    cfg.num_attention_heads = heads;
    cfg.num_key_value_heads = Some(kv_heads);
    cfg.head_dim = Some(head);
    cfg.intermediate_size = if orig.intermediate_size > 0 {
        uri.get("intermediate", 2 * hidden)?
    } else {
        0
    };
    cfg.num_hidden_layers = uri.get("layers", 2)?;
    cfg.lora = None;
    // Checkpoints pad their vocabulary past the tokenizer's (Qwen2.5: 152,064 rows for 151,665
    // tokens); a trained model never samples the padding, a random stand-in would, and no
    // tokenizer decodes it. So the stand-in's vocabulary ends where its tokenizer's does (a
    // tokenizer larger than the config keeps the config's size, and its error).
    if let Ok(tok) = crate::tokenizer::Tokenizer::from_dir(std::path::Path::new(&from)) {
        let used = i64::try_from(tok.vocab_size()).unwrap_or(i64::MAX);
        cfg.vocab_size = cfg.vocab_size.min(used);
    }
    if orig.moe.num_experts > 0 {
        let top_k = orig.moe.num_experts_per_tok;
        let experts: i64 = uri.get("experts", 4.max(top_k).min(orig.moe.num_experts))?;
        cfg.moe.num_experts = experts;
        cfg.moe.moe_intermediate_size = hidden;
        if orig.moe.shared_expert_intermediate_size > 0 {
            cfg.moe.shared_expert_intermediate_size = hidden;
        }
        // A dense layer and a sparse one when the model has both kinds.
        let mixed = !orig.moe.mlp_only_layers.is_empty() || orig.moe.decoder_sparse_step > 1;
        cfg.moe.decoder_sparse_step = 1;
        cfg.moe.mlp_only_layers = if mixed { vec![0] } else { Vec::new() };
        if mixed && cfg.intermediate_size == 0 {
            cfg.intermediate_size = 2 * hidden;
        }
    }
    if arch.row().sliding_layers {
        // The source's alternation of windowed and full layers, cut to the stand-in's depth
        // (both kinds at two layers and more).
        cfg.linear.layer_types = (0..cfg.num_hidden_layers.max(0) as usize)
            .map(|i| {
                let kinds = &orig.linear.layer_types;
                kinds
                    .get(i % kinds.len().max(1))
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
    }
    if let Some(s) = orig
        .extra
        .get("query_pre_attn_scalar")
        .and_then(serde_json::Value::as_f64)
    {
        // The source's attention scale relative to its head width, kept.
        let scaled = s * head as f64 / orig.head_dim() as f64;
        cfg.extra
            .insert("query_pre_attn_scalar".into(), json!(scaled));
    }
    if arch.row().expert_style.biased() {
        // Its experts are `intermediate_size` wide.
        cfg.intermediate_size = cfg.moe.moe_intermediate_size;
    }
    if arch.is_qwen3_5() {
        // One Gated DeltaNet layer then one gated full-attention layer (repeated).
        cfg.linear.layer_types = (0..cfg.num_hidden_layers)
            .map(|i| {
                if i % 2 == 1 {
                    "full_attention"
                } else {
                    "linear_attention"
                }
                .to_owned()
            })
            .collect();
        cfg.linear.linear_key_head_dim = head;
        cfg.linear.linear_value_head_dim = head;
        cfg.linear.linear_num_key_heads = kv_heads;
        cfg.linear.linear_num_value_heads = heads;
        cfg.extra.remove("full_attention_interval");
    }
    if arch.has_vision() {
        scale_vision_tower(&mut cfg);
    }
    cfg.validate()
        .map_err(|e| format!("{}: scaled down: {e}", file.display()))?;
    Ok(cfg)
}

/// M-RoPE sections of a small model's heads in Qwen's proportions: a quarter of the rotary
/// half for time, the rest split between height and width.
fn tiny_mrope_section(cfg: &ModelConfig) -> serde_json::Value {
    let half = cfg.rotary_dim() / 2;
    let time = half / 4;
    let height = (half - time) / 2;
    json!([time, height, half - time - height])
}

/// The `model_type` of a family's `vision_config`, as its published configs write it
/// (transformers 5 names Qwen3.5's `qwen3_5_vision`; Qwen's files name the others after the
/// model).
fn tower_model_type(arch: Arch) -> String {
    let model_type = arch.row().model_type;
    if arch.tower() == Some(verlc_spec::families::VisionTower::Qwen3_5) {
        format!("{model_type}_vision")
    } else {
        model_type.to_owned()
    }
}

/// The tiny tower's sizes in `vision_config`: two blocks of width 64 with four heads, the
/// second attending over whole images (Qwen2.5-VL's windows; Qwen3-VL's and Qwen3.5's towers
/// attend over whole images in every block, and Qwen3-VL's take DeepStack features after the
/// first, or after each for `deepstack` 2), merged to the text model's width `hidden`.
fn set_tiny_tower(
    vision: &mut Map<String, serde_json::Value>,
    hidden: i64,
    arch: Arch,
    deepstack: usize,
) {
    for (key, value) in [
        ("depth", json!(2)),
        ("hidden_size", json!(64)),
        ("num_heads", json!(4)),
        ("intermediate_size", json!(128)),
        ("out_hidden_size", json!(hidden)),
    ] {
        vision.insert(key.into(), value);
    }
    match arch.tower() {
        Some(t) if t.deepstack() => {
            let levels: Vec<usize> = (0..deepstack.clamp(1, 2)).collect();
            vision.insert("deepstack_visual_indexes".into(), json!(levels));
        }
        Some(t) if t.qwen3_style() => {}
        _ => {
            vision.insert("fullatt_block_indexes".into(), json!([1]));
        }
    }
}

/// A vision-language stand-in's tower, scaled down to the tiny model's with the source's
/// patch, temporal patch, merge and window sizes, so the source's image processor feeds it
/// the same patches; its M-RoPE sections re-cut for the smaller heads.
fn scale_vision_tower(cfg: &mut ModelConfig) {
    let section = tiny_mrope_section(cfg);
    if let Some(rope) = cfg.rope_scaling.as_mut() {
        rope.insert("mrope_section".into(), section);
    }
    let hidden = cfg.hidden_size;
    let Ok(arch) = cfg.arch() else { return };
    if let Some(serde_json::Value::Object(v)) = cfg.extra.get_mut("vision_config") {
        set_tiny_tower(v, hidden, arch, 1);
        // Older configs name the width `embed_dim` and the heads' MLP ratio.
        v.remove("embed_dim");
    }
}
