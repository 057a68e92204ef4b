//! `config.json` of a Llama / Qwen2 / Qwen3 / Qwen3-MoE / Qwen3.5 checkpoint. Field names are
//! the Hugging Face keys; keys this crate does not use are kept in `extra` so a saved config
//! round-trips. A vision-language checkpoint's text model keys (transformers nests them in
//! `text_config`) are read at the top level; see [`ModelConfig::from_file`].

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use verlc_spec::families::ExpertStyle;

use super::ModelError;

/// The decoder family of a `model_type`: a row of the spec's model table
/// ([`verlc_spec::families`]).
pub use verlc_spec::families::Family as Arch;

fn default_rope_theta() -> f64 {
    10000.0
}
fn default_eps() -> f64 {
    1e-6
}
fn default_init_range() -> f64 {
    0.02
}
fn default_act() -> String {
    "silu".to_owned()
}
fn default_max_pos() -> i64 {
    4096
}
fn default_sparse_step() -> i64 {
    1
}

/// The mixture-of-experts keys of `config.json` (Qwen3-MoE's names); all absent for dense
/// models. A layer `i` is sparse when `num_experts > 0`, `i` is not in `mlp_only_layers` and
/// `(i + 1) % decoder_sparse_step == 0`, as transformers decides it. Keys at transformers'
/// defaults are not written back, so a saved dense config gains none of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    /// transformers 5 writes Qwen3-VL-MoE's as `num_local_experts`.
    #[serde(default, alias = "num_local_experts", skip_serializing_if = "is_zero")]
    pub num_experts: i64,
    /// Experts each token is routed to (top-k).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub num_experts_per_tok: i64,
    /// Intermediate size of each expert's SwiGLU MLP.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moe_intermediate_size: i64,
    /// Renormalise the top-k routing weights to sum to one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub norm_topk_prob: bool,
    #[serde(default = "default_sparse_step", skip_serializing_if = "is_one")]
    pub decoder_sparse_step: i64,
    /// Layers that keep a dense MLP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mlp_only_layers: Vec<i64>,
    /// Qwen3.5-MoE's shared expert (a SwiGLU MLP every token runs through, scaled by a
    /// sigmoid gate) beside the routed ones; 0 for none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared_expert_intermediate_size: i64,
}

/// The linear-attention keys of Qwen3.5 (`qwen3_5_text`): which layers are Gated DeltaNet
/// (`layer_types`, else every `full_attention_interval`-th layer is full attention) and the
/// DeltaNet's sizes. Absent for the other families; [`ModelConfig::normalize`] fills
/// transformers' defaults for a Qwen3.5 config that omits them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinearAttentionConfig {
    /// `linear_attention` or `full_attention` per layer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_types: Vec<String>,
    /// Width of the short causal convolution over q, k and v.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub linear_conv_kernel_dim: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub linear_key_head_dim: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub linear_value_head_dim: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub linear_num_key_heads: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub linear_num_value_heads: i64,
}

impl LinearAttentionConfig {
    /// Channels of the convolution: queries, keys and values side by side.
    pub fn conv_dim(&self) -> i64 {
        2 * self.key_dim() + self.value_dim()
    }

    pub fn key_dim(&self) -> i64 {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    pub fn value_dim(&self) -> i64 {
        self.linear_num_value_heads * self.linear_value_head_dim
    }
}

/// The keys of a `text_config` the top level lacks (not its `model_type` or `architectures`).
fn fill_missing(obj: &mut serde_json::Map<String, Value>, text: serde_json::Map<String, Value>) {
    for (k, v) in text {
        if !matches!(k.as_str(), "model_type" | "architectures") {
            obj.entry(k).or_insert(v);
        }
    }
}

/// A vision-language checkpoint (a family with a vision tower) read with its text model's
/// keys at the top level, as Qwen's own files write them: transformers 4.57 and 5 nest them in
/// `text_config`, whose keys fill the ones the top level lacks (the family's `model_type`
/// stays; the vision keys are kept beside them); transformers 5's `rope_parameters` is read as
/// `rope_scaling` and `rope_theta`.
fn lift_text_config(raw: &mut Value) {
    let Some(obj) = raw.as_object_mut() else {
        return;
    };
    let vision = obj
        .get("model_type")
        .and_then(Value::as_str)
        .and_then(Arch::from_model_type)
        .is_some_and(Arch::has_vision);
    if !vision {
        return;
    }
    if let Some(Value::Object(text)) = obj.remove("text_config") {
        fill_missing(obj, text);
    }
    // transformers 5 writes the rotary settings as `rope_parameters` (with `rope_theta`
    // inside): the same keys `rope_scaling` holds in Qwen's files.
    if !obj.contains_key("rope_scaling")
        && let Some(Value::Object(mut rope)) = obj.get("rope_parameters").cloned()
    {
        if let Some(theta) = rope.remove("rope_theta") {
            obj.entry("rope_theta").or_insert(theta);
        }
        obj.insert("rope_scaling".into(), Value::Object(rope));
    }
}

/// The keys a config left out (or, for `head_dim`, left null) set to what its family's
/// config class takes (Qwen3's `head_dim` is 128, not hidden / heads; other rows tie
/// embeddings, gate with a GELU or default biases and dropouts), as transformers reads the file.
fn fill_family_defaults(raw: &mut Value) {
    use verlc_spec::families::ConfigValue;
    let Some(obj) = raw.as_object_mut() else {
        return;
    };
    let Some(arch) = obj
        .get("model_type")
        .and_then(Value::as_str)
        .and_then(Arch::from_model_type)
    else {
        return;
    };
    for (key, value) in arch.row().config_defaults {
        if obj.get(*key).is_some_and(|v| !v.is_null()) {
            continue;
        }
        let value = match *value {
            ConfigValue::Bool(b) => Value::from(b),
            ConfigValue::Int(n) => Value::from(n),
            ConfigValue::Float(x) => Value::from(x),
            ConfigValue::Str(s) => Value::from(s),
        };
        obj.insert((*key).to_owned(), value);
    }
    // A family whose config class names the gate activation by another key: that key is the
    // activation (transformers' Gemma 2 reads `hidden_activation` and ignores `hidden_act`).
    let key = arch.row().activation_key;
    if key != "hidden_act"
        && let Some(act) = obj.get(key).filter(|v| !v.is_null()).cloned()
    {
        obj.insert("hidden_act".to_owned(), act);
    }
}

/// `layer_types` of `layers` attention layers, `sliding_attention` where `sliding(i)`.
fn attention_types(layers: i64, sliding: impl Fn(i64) -> bool) -> Vec<String> {
    (0..layers.max(0))
        .map(|i| {
            if sliding(i) {
                "sliding_attention"
            } else {
                "full_attention"
            }
            .to_owned()
        })
        .collect()
}

/// Each size the config left out (0, serde's default) set to its default.
fn fill_absent<const N: usize>(sizes: [(&mut i64, i64); N]) {
    for (v, default) in sizes {
        if *v == 0 {
            *v = default;
        }
    }
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn is_one(n: &i64) -> bool {
    *n == 1
}

impl Default for MoeConfig {
    fn default() -> Self {
        MoeConfig {
            num_experts: 0,
            num_experts_per_tok: 0,
            moe_intermediate_size: 0,
            norm_topk_prob: false,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            shared_expert_intermediate_size: 0,
        }
    }
}

/// The model hyper-parameters, as written in `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub model_type: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
    /// The dense MLP's width (absent in Qwen3.5-MoE, whose layers are all sparse).
    #[serde(default)]
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<i64>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<Map<String, Value>>,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: i64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Mixture-of-experts keys (Qwen3-MoE); defaults for dense models.
    #[serde(flatten)]
    pub moe: MoeConfig,
    /// Qwen3.5's share of the head dimension that is rotated (`partial_rotary_factor`, top
    /// level or in `rope_parameters`); `None` rotates all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f64>,
    /// Gated DeltaNet keys (Qwen3.5); empty for the other families.
    #[serde(flatten)]
    pub linear: LinearAttentionConfig,
    /// LoRA adapters the model is built with (not part of `config.json`).
    #[serde(skip)]
    pub lora: Option<super::lora::LoraConfig>,
    /// Every other key of the file (architectures, dtype, token ids …), preserved on save.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ModelConfig {
    /// This config with `overrides` applied as `config.json` keys (verl's
    /// `model.override_config`, which updates the Hugging Face config before the model is
    /// built), checked again.
    pub fn with_overrides(&self, overrides: &Map<String, Value>) -> Result<Self, String> {
        if overrides.is_empty() {
            return Ok(self.clone());
        }
        let mut v = serde_json::to_value(self).map_err(|e| e.to_string())?;
        if let Some(obj) = v.as_object_mut() {
            for (k, x) in overrides {
                obj.insert(k.clone(), x.clone());
            }
        }
        let mut cfg: ModelConfig = serde_json::from_value(v).map_err(|e| e.to_string())?;
        cfg = cfg.normalize()?;
        cfg.lora = self.lora.clone();
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let bad = |msg: String| ModelError::Config {
            file: path.to_owned(),
            msg,
        };
        let mut raw: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if let Some(obj) = raw.as_object_mut()
            && obj.get("model_type").and_then(Value::as_str) == Some("qwen3_next")
        {
            // `Qwen3NextConfig` renormalises the top-k weights unless told otherwise (the
            // field's own default, false, is Qwen3-MoE's).
            obj.entry("norm_topk_prob").or_insert(Value::Bool(true));
        }
        lift_text_config(&mut raw);
        fill_family_defaults(&mut raw);
        let cfg: ModelConfig = serde_json::from_value(raw).map_err(|e| bad(e.to_string()))?;
        let cfg = cfg.normalize().map_err(bad)?;
        cfg.validate().map_err(|msg| ModelError::Config {
            file: path.to_owned(),
            msg,
        })?;
        Ok(cfg)
    }

    /// Fills in what transformers' config classes default: Qwen3-VL-MoE's expert sizes, the
    /// windowed layers of a Qwen2/Qwen3 under `use_sliding_window`, and
    /// for Qwen3.5's families (text or image-text) `rope_parameters`' `rope_theta` and
    /// `partial_rotary_factor` and the keys a Qwen3.5 text config leaves out. Other families
    /// are returned unchanged.
    pub fn normalize(mut self) -> Result<Self, String> {
        let arch = self.arch().ok();
        if arch == Some(Arch::Qwen3VlMoe) {
            // `Qwen3VLMoeTextConfig`'s defaults; its router always renormalises the top-k
            // weights (transformers 4.57 and 5 alike do not read `norm_topk_prob`).
            let m = &mut self.moe;
            m.norm_topk_prob = true;
            fill_absent([
                (&mut m.num_experts, 60),
                (&mut m.num_experts_per_tok, 4),
                (&mut m.moe_intermediate_size, 1408),
            ]);
        }
        if arch.is_some_and(|a| a.row().expert_style.biased()) {
            // The family's config class: the experts' count is `num_local_experts` (read through
            // its alias), their width `intermediate_size`; its router soft-maxes the top-k
            // logits, which is the full softmax's top-k renormalised.
            let m = &mut self.moe;
            m.norm_topk_prob = true;
            fill_absent([(&mut m.moe_intermediate_size, self.intermediate_size)]);
        }
        if arch.is_some_and(|a| a.row().max_window_layers)
            && self.use_sliding_window
            && self.linear.layer_types.is_empty()
        {
            // The config class's default: the layers from `max_window_layers` (28) on.
            let from = self
                .extra
                .get("max_window_layers")
                .and_then(Value::as_i64)
                .unwrap_or(28);
            self.linear.layer_types = attention_types(self.num_hidden_layers, |i| i >= from);
        }
        if arch.is_some_and(|a| a.row().sliding_layers) && self.linear.layer_types.is_empty() {
            // The config class's default: sliding-window layers first, alternating.
            self.linear.layer_types = attention_types(self.num_hidden_layers, |i| i % 2 == 0);
        }
        if !arch.is_some_and(Arch::is_qwen3_5) {
            return Ok(self);
        }
        if arch.map(Arch::text) == Some(Arch::Qwen3_5Moe) {
            // Every layer sparse, top-k weights always renormalised (transformers' router).
            let m = &mut self.moe;
            m.norm_topk_prob = true;
            fill_absent([
                (&mut m.num_experts, 256),
                (&mut m.num_experts_per_tok, 8),
                (&mut m.moe_intermediate_size, 512),
                (&mut m.shared_expert_intermediate_size, 512),
            ]);
        }
        if arch == Some(Arch::Qwen3Next) {
            // `Qwen3NextConfig`'s defaults (its router renormalises as `norm_topk_prob` says;
            // an absent one is true, set where the file is read).
            let m = &mut self.moe;
            fill_absent([
                (&mut m.num_experts, 512),
                (&mut m.num_experts_per_tok, 10),
                (&mut m.moe_intermediate_size, 512),
                (&mut m.shared_expert_intermediate_size, 512),
            ]);
        }
        if let Some(rope) = self.extra.get("rope_parameters").and_then(Value::as_object) {
            let kind = rope.get("rope_type").and_then(Value::as_str);
            if let Some(kind) = kind.filter(|k| *k != "default") {
                return Err(format!(
                    "rope_parameters.rope_type `{kind}` is not supported for qwen3_5 (default only)"
                ));
            }
            if let Some(theta) = rope.get("rope_theta").and_then(Value::as_f64) {
                self.rope_theta = theta;
            }
            if let Some(f) = rope.get("partial_rotary_factor").and_then(Value::as_f64) {
                self.partial_rotary_factor = Some(f);
            }
        }
        self.partial_rotary_factor.get_or_insert(0.25);
        self.head_dim.get_or_insert(256);
        if arch.is_some_and(Arch::has_vision) {
            // Qwen3.5's rotary embedding takes these sections when its settings name none.
            let rope = self.rope_scaling.get_or_insert_with(Map::new);
            if rope.get("mrope_section").is_none_or(Value::is_null) {
                rope.insert("mrope_section".into(), serde_json::json!([11, 11, 10]));
            }
        }
        let l = &mut self.linear;
        fill_absent([
            (&mut l.linear_conv_kernel_dim, 4),
            (&mut l.linear_key_head_dim, 128),
            (&mut l.linear_value_head_dim, 128),
            (&mut l.linear_num_key_heads, 16),
            (&mut l.linear_num_value_heads, 32),
        ]);
        if l.layer_types.is_empty() {
            let every = self
                .extra
                .get("full_attention_interval")
                .and_then(Value::as_i64)
                .unwrap_or(4);
            if every <= 0 {
                return Err(format!(
                    "full_attention_interval must be positive, got {every}"
                ));
            }
            l.layer_types = (0..self.num_hidden_layers.max(0))
                .map(|i| {
                    if (i + 1) % every == 0 {
                        "full_attention"
                    } else {
                        "linear_attention"
                    }
                    .to_owned()
                })
                .collect();
        }
        Ok(self)
    }

    /// Checks that the family supports this configuration.
    pub fn validate(&self) -> Result<(), String> {
        let arch = self.arch()?;
        if arch.row().sliding_window_unless_null
            && let Some(w) = self.extra.get("sliding_window").filter(|w| !w.is_null())
            && w.as_i64().is_none_or(|w| w <= 0)
        {
            return Err(format!(
                "sliding_window must be a positive integer or null, got {w}"
            ));
        }
        if super::layers::Activation::of(&self.hidden_act).is_none() {
            return Err(format!(
                "hidden_act `{}` is not supported (silu, gelu, gelu_pytorch_tanh)",
                self.hidden_act
            ));
        }
        if arch.has_experts()
            && !verlc_spec::families::EXPERT_ACTIVATIONS.contains(&self.hidden_act.as_str())
        {
            return Err(format!(
                "hidden_act `{}` with experts is not supported (their MLPs are SwiGLU)",
                self.hidden_act
            ));
        }
        if self.use_sliding_window && !arch.row().max_window_layers {
            return Err(format!(
                "use_sliding_window = true is not supported for model_type `{}`",
                self.model_type
            ));
        }
        if arch.row().sliding_layers {
            self.validate_sliding_layers()?;
        }
        if arch.row().soft_capping {
            self.validate_soft_capping()?;
        }
        if let Some(q) = self
            .extra
            .get("quantization_config")
            .filter(|q| !q.is_null())
        {
            let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
            return Err(format!(
                "quantization_config: the checkpoint is quantized (quant_method `{method}`) and \
                 verlc loads unquantized weights; train from a dequantized (bf16) copy"
            ));
        }
        let pos = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.dense_width()),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("head_dim", self.head_dim()),
        ];
        if let Some((k, v)) = pos.iter().find(|(_, v)| *v <= 0) {
            return Err(format!("{k} must be positive, got {v}"));
        }
        if self.num_attention_heads % self.kv_heads() != 0 {
            return Err(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.kv_heads()
            ));
        }
        if self.head_dim() % 2 != 0 {
            return Err(format!(
                "head_dim ({}) must be even for RoPE",
                self.head_dim()
            ));
        }
        super::rope::RopeScaling::from_config(self)?;
        self.validate_linear()?;
        self.validate_moe()
    }

    /// `intermediate_size` where some layer has a dense MLP (1 when none does: the key is
    /// not needed then).
    fn dense_width(&self) -> i64 {
        let dense = (0..self.num_hidden_layers.max(0) as usize).any(|l| !self.sparse_layer(l));
        if dense { self.intermediate_size } else { 1 }
    }

    /// A family whose `sliding_attention` layers attend within `sliding_window`: one known
    /// type per layer and a positive window.
    fn validate_sliding_layers(&self) -> Result<(), String> {
        let types = &self.linear.layer_types;
        if types.len() as i64 != self.num_hidden_layers {
            return Err(format!(
                "layer_types has {} entries for {} layers",
                types.len(),
                self.num_hidden_layers
            ));
        }
        if let Some(t) = types
            .iter()
            .find(|t| !matches!(t.as_str(), "sliding_attention" | "full_attention"))
        {
            return Err(format!(
                "layer_types entry `{t}` is not sliding_attention or full_attention"
            ));
        }
        match self.extra.get("sliding_window").map(Value::as_i64) {
            Some(Some(w)) if w > 0 => Ok(()),
            _ if !types.iter().any(|t| t == "sliding_attention") => Ok(()),
            other => Err(format!(
                "sliding_window must be a positive integer for sliding_attention layers, got {}",
                other.flatten().map_or("none".to_owned(), |w| w.to_string())
            )),
        }
    }

    /// A soft-capping family's caps (positive, or null for none) and query scale (positive).
    fn validate_soft_capping(&self) -> Result<(), String> {
        for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
            match self.extra.get(key) {
                None | Some(Value::Null) => {}
                Some(v) if v.as_f64().is_some_and(|c| c > 0.0) => {}
                Some(v) => return Err(format!("{key} must be a positive number or null, got {v}")),
            }
        }
        match self.extra.get("query_pre_attn_scalar") {
            Some(v) if v.as_f64().is_some_and(|s| s > 0.0) => Ok(()),
            other => Err(format!(
                "query_pre_attn_scalar must be a positive number, got {}",
                other.map_or("none".to_owned(), Value::to_string)
            )),
        }
    }

    /// The Qwen3.5 keys: consistent for `qwen3_5_text` / `qwen3_5_moe_text`, absent otherwise.
    fn validate_linear(&self) -> Result<(), String> {
        let l = &self.linear;
        if !self.arch()?.is_qwen3_5() {
            // transformers writes `layer_types` (all full attention) for Qwen2/Qwen3 too.
            let linear = l.layer_types.iter().any(|t| t == "linear_attention");
            let partial = self.partial_rotary_factor.is_some_and(|f| f != 1.0);
            if linear || partial {
                return Err(format!(
                    "linear_attention layers / partial_rotary_factor on model_type `{}`: they \
                     are implemented for qwen3_5",
                    self.model_type
                ));
            }
            return Ok(());
        }
        if l.layer_types.len() as i64 != self.num_hidden_layers {
            return Err(format!(
                "layer_types has {} entries for {} layers",
                l.layer_types.len(),
                self.num_hidden_layers
            ));
        }
        if let Some(t) = l
            .layer_types
            .iter()
            .find(|t| !matches!(t.as_str(), "linear_attention" | "full_attention"))
        {
            return Err(format!(
                "layer_types entry `{t}` is not linear_attention or full_attention"
            ));
        }
        let pos = [
            ("linear_conv_kernel_dim", l.linear_conv_kernel_dim),
            ("linear_key_head_dim", l.linear_key_head_dim),
            ("linear_value_head_dim", l.linear_value_head_dim),
            ("linear_num_key_heads", l.linear_num_key_heads),
            ("linear_num_value_heads", l.linear_num_value_heads),
        ];
        if let Some((k, v)) = pos.iter().find(|(_, v)| *v <= 0) {
            return Err(format!("{k} must be positive for qwen3_5, got {v}"));
        }
        if l.linear_num_value_heads % l.linear_num_key_heads != 0 {
            return Err(format!(
                "linear_num_value_heads ({}) is not a multiple of linear_num_key_heads ({})",
                l.linear_num_value_heads, l.linear_num_key_heads
            ));
        }
        let f = self.partial_rotary_factor.unwrap_or(1.0);
        if !(f > 0.0 && f <= 1.0) || self.rotary_dim() % 2 != 0 || self.rotary_dim() == 0 {
            return Err(format!(
                "partial_rotary_factor {f} gives a rotary dimension of {} (head_dim {}); it \
                 must be even and positive",
                self.rotary_dim(),
                self.head_dim()
            ));
        }
        Ok(())
    }

    /// Why a model of this config cannot be trained here, if it cannot: a dropout, which
    /// transformers (and so verl) applies in training updates and verlc's models do not
    /// have. `verlc build` refuses the same configs at the model's key.
    pub fn training_problem(&self) -> Option<String> {
        verlc_spec::families::DROPOUT_KEYS.iter().find_map(|&key| {
            let p = self.extra.get(key).and_then(Value::as_f64)?;
            (p != 0.0).then(|| {
                format!(
                    "{key} = {p}: transformers (and verl) applies dropout in training \
                         updates and verlc's models have none; set it to 0.0 \
                         (`actor_rollout_ref.model.override_config.{key}=0.0`) for a \
                         deterministic update"
                )
            })
        })
    }

    /// Whether layer `layer` is a Gated DeltaNet (linear attention) layer.
    pub fn linear_layer(&self, layer: usize) -> bool {
        self.linear
            .layer_types
            .get(layer)
            .is_some_and(|t| t == "linear_attention")
    }

    /// Whether any layer carries a recurrent state instead of (only) keys and values.
    pub fn has_linear_layers(&self) -> bool {
        (0..self.num_hidden_layers.max(0) as usize).any(|l| self.linear_layer(l))
    }

    /// The rotated share of each head: `head_dim * partial_rotary_factor` (all of it
    /// without the key), as transformers truncates it.
    pub fn rotary_dim(&self) -> i64 {
        match self.partial_rotary_factor {
            Some(f) => (self.head_dim() as f64 * f) as i64,
            None => self.head_dim(),
        }
    }

    /// RMSNorm scales by `1 + weight` (weights start at zero) and casts after (as the
    /// family's row says: Qwen3.5's, among others).
    pub fn zero_centered_norm(&self) -> bool {
        self.arch().is_ok_and(|a| a.row().norm_plus_one)
    }

    /// What the embeddings are multiplied by before the first layer (`sqrt(hidden_size)`,
    /// where the family's row says so), if anything.
    pub fn embedding_scale(&self) -> Option<f64> {
        self.arch()
            .is_ok_and(|a| a.row().scaled_embedding)
            .then(|| (self.hidden_size as f64).sqrt())
    }

    /// How many keys back layer `layer`'s queries see (`Some(w)`: the keys less than `w`
    /// positions before the query, itself included), where the family's row gives its
    /// `sliding_attention` layers a window, or every layer the config's `sliding_window`
    /// (Mistral's row); `None`: every earlier key.
    pub fn attention_window(&self, layer: usize) -> Option<i64> {
        let row = self.arch().ok()?.row();
        if row.sliding_window_unless_null {
            // Every layer, whenever the config sets one (Mistral 7B v0.1's 4,096).
            return self.extra.get("sliding_window").and_then(Value::as_i64);
        }
        // The `sliding_attention` layers: always where the row says so, under
        // `use_sliding_window` for Qwen2/Qwen3. An absent window is their class's 4,096 (the
        // other rows' defaults fill theirs in); a null one windows nothing.
        let windowed = row.sliding_layers || (row.max_window_layers && self.use_sliding_window);
        let sliding = self.linear.layer_types.get(layer)? == "sliding_attention";
        let window = match self.extra.get("sliding_window") {
            None => Some(4096),
            Some(w) => w.as_i64(),
        };
        window.filter(|_| windowed && sliding)
    }

    /// The cap of a soft-capping family's `key` (`attn_logit_softcapping`,
    /// `final_logit_softcapping`): `cap · tanh(x / cap)`; `None`: uncapped.
    fn soft_cap(&self, key: &str) -> Option<f64> {
        let row = self.arch().ok()?.row();
        row.soft_capping
            .then(|| self.extra.get(key).and_then(Value::as_f64))
            .flatten()
    }

    /// The cap of each attention score, if the family caps them.
    pub fn attention_softcap(&self) -> Option<f64> {
        self.soft_cap("attn_logit_softcapping")
    }

    /// The cap of each output logit, if the family caps them.
    pub fn final_logit_softcap(&self) -> Option<f64> {
        self.soft_cap("final_logit_softcapping")
    }

    /// What the queries are multiplied by so that attention's `1 / sqrt(head_dim)` scale
    /// becomes the family's `1 / sqrt(query_pre_attn_scalar)`; `None` where they agree (every
    /// family without the key, and Gemma 2's 2B and 9B).
    pub fn query_scale(&self) -> Option<f64> {
        let row = self.arch().ok()?.row();
        let s = self
            .extra
            .get("query_pre_attn_scalar")
            .and_then(Value::as_f64)
            .filter(|_| row.soft_capping)?;
        let d = self.head_dim() as f64;
        (s != d).then(|| (d / s).sqrt())
    }

    /// Whether each layer norms its mixer's and MLP's outputs too (the family's row).
    pub fn sandwich_norms(&self) -> bool {
        self.arch().is_ok_and(|a| a.row().sandwich_norms)
    }

    /// What of this model the Megatron engine does not compute in a layout, if anything:
    /// attention sinks, sliding windows or soft-capped scores under context parallelism (a rank's queries are
    /// not the last of the keys it gathers), biased experts split over the tensor-parallel
    /// group (each expert's down-projection bias would have to be added once per rank
    /// group before the routing weights).
    pub fn megatron_gap(
        &self,
        context_parallel: bool,
        experts_split: bool,
    ) -> Option<&'static str> {
        let row = self.arch().ok()?.row();
        let windowed =
            (0..self.num_hidden_layers.max(0) as usize).any(|l| self.attention_window(l).is_some());
        if context_parallel && (row.eager_attention() || windowed) {
            Some("attention sinks, sliding windows or soft-capped scores under context parallelism")
        } else if experts_split && row.expert_style.biased() {
            Some("biased experts split over tensor-parallel ranks (expert tensor parallel > 1)")
        } else {
            None
        }
    }

    /// Whether each attention head has a learned sink logit (`self_attn.sinks`).
    pub fn attention_sinks(&self) -> bool {
        self.arch().is_ok_and(|a| a.row().attention_sinks)
    }

    /// How the routed experts are stored and computed.
    pub fn expert_style(&self) -> ExpertStyle {
        self.arch()
            .map_or(ExpertStyle::PerExpert, |a| a.row().expert_style)
    }

    /// The clamp of the biased experts' SwiGLU (`swiglu_limit`, 7.0 when absent, as the
    /// family's config class has it).
    pub fn swiglu_limit(&self) -> f64 {
        self.extra
            .get("swiglu_limit")
            .and_then(Value::as_f64)
            .unwrap_or(7.0)
    }

    /// Qwen3.5's full attention: `q_proj` also yields a per-head sigmoid gate on the output.
    pub fn attn_output_gate(&self) -> bool {
        self.arch().is_ok_and(Arch::is_qwen3_5)
    }

    /// The expert keys: required and consistent for `qwen3_moe`, absent otherwise.
    fn validate_moe(&self) -> Result<(), String> {
        let m = &self.moe;
        let arch = self.arch()?;
        if !arch.has_experts() {
            if m.num_experts != 0 {
                return Err(format!(
                    "num_experts = {} on model_type `{}`: experts are implemented for qwen3_moe \
                     and qwen3_5_moe",
                    m.num_experts, self.model_type
                ));
            }
            return Ok(());
        }
        if matches!(arch.text(), Arch::Qwen3_5Moe | Arch::Qwen3Next)
            && m.shared_expert_intermediate_size <= 0
        {
            return Err(format!(
                "shared_expert_intermediate_size must be positive for {}, got {}",
                self.model_type, m.shared_expert_intermediate_size
            ));
        }
        let pos = [
            ("num_experts", m.num_experts),
            ("num_experts_per_tok", m.num_experts_per_tok),
            ("moe_intermediate_size", m.moe_intermediate_size),
            ("decoder_sparse_step", m.decoder_sparse_step),
        ];
        if let Some((k, v)) = pos.iter().find(|(_, v)| *v <= 0) {
            return Err(format!("{k} must be positive for qwen3_moe, got {v}"));
        }
        if m.num_experts_per_tok > m.num_experts {
            return Err(format!(
                "num_experts_per_tok ({}) exceeds num_experts ({})",
                m.num_experts_per_tok, m.num_experts
            ));
        }
        Ok(())
    }

    /// Whether layer `layer` has a sparse mixture-of-experts MLP (see [`MoeConfig`]).
    pub fn sparse_layer(&self, layer: usize) -> bool {
        let m = &self.moe;
        m.num_experts > 0
            && m.decoder_sparse_step > 0
            && !m.mlp_only_layers.contains(&(layer as i64))
            && (layer as i64 + 1) % m.decoder_sparse_step == 0
    }

    /// The text model of an image-text family built on a text family's layers (a Qwen3.5
    /// checkpoint's `qwen3_5_text`), without the vision keys: what such a model is where it
    /// only ever sees text (the vLLM server of a run that sends it text prompts). `None` for
    /// other families.
    pub fn text_model(&self) -> Option<ModelConfig> {
        let arch = self.arch().ok()?;
        if arch.text() == arch {
            return None;
        }
        let mut text = self.clone();
        text.model_type = arch.text().row().model_type.to_owned();
        for key in [
            "vision_config",
            "image_token_id",
            "video_token_id",
            "vision_start_token_id",
            "vision_end_token_id",
        ] {
            text.extra.remove(key);
        }
        Some(text)
    }

    /// The family of this config.
    pub fn arch(&self) -> Result<Arch, String> {
        Arch::from_model_type(&self.model_type).ok_or_else(|| {
            format!(
                "model_type `{}` is not supported ({})",
                self.model_type,
                verlc_spec::families::checkpoint_model_types().join(", ")
            )
        })
    }

    /// transformers' embedding `padding_idx`: `pad_token_id` when it names a token of the
    /// vocabulary, else -1 (none).
    pub fn padding_idx(&self) -> i64 {
        self.extra
            .get("pad_token_id")
            .and_then(Value::as_i64)
            .filter(|id| (0..self.vocab_size).contains(id))
            .unwrap_or(-1)
    }

    pub fn kv_heads(&self) -> i64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> i64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Bias on q/k/v projections: always for Qwen2, `attention_bias` otherwise.
    pub fn qkv_bias(&self) -> bool {
        self.arch().is_ok_and(|a| a.row().qkv_bias) || self.attention_bias.unwrap_or(false)
    }

    /// Bias on the output projection (`attention_bias` of Llama and Qwen3; never for Qwen2;
    /// `attention_out_bias` where the family's row names that key).
    pub fn o_bias(&self) -> bool {
        match self.arch() {
            Ok(a) if a.row().attention_out_bias => self
                .extra
                .get("attention_out_bias")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            Ok(a) if a.row().qkv_bias => false,
            _ => self.attention_bias.unwrap_or(false),
        }
    }

    /// RMSNorm on per-head queries and keys (Qwen3).
    pub fn qk_norm(&self) -> bool {
        self.arch().is_ok_and(Arch::qk_norm)
    }

    /// Number of parameters of the causal LM (embedding counted once when tied).
    pub fn num_parameters(&self) -> i64 {
        let (h, i, v, hd) = (
            self.hidden_size,
            self.intermediate_size,
            self.vocab_size,
            self.head_dim(),
        );
        let (q, kv) = (self.num_attention_heads * hd, self.kv_heads() * hd);
        let gate = if self.attn_output_gate() { 2 } else { 1 };
        let mut attn = gate * h * q + 2 * h * kv + q * h;
        if self.qkv_bias() {
            attn += q + 2 * kv;
        }
        if self.o_bias() {
            attn += h;
        }
        if self.qk_norm() {
            attn += 2 * hd;
        }
        if self.attention_sinks() {
            attn += self.num_attention_heads;
        }
        let dense = 3 * h * i + if self.mlp_bias { 2 * i + h } else { 0 };
        let m = &self.moe;
        let shared = if m.shared_expert_intermediate_size > 0 {
            3 * h * m.shared_expert_intermediate_size + h
        } else {
            0
        };
        let mi = m.moe_intermediate_size;
        // Biased experts: the router's bias and each expert's three projection biases.
        let biases = if self.expert_style().biased() {
            1 + 2 * mi + h
        } else {
            0
        };
        let sparse = m.num_experts * (h + 3 * h * mi + biases) + shared;
        let l = &self.linear;
        let nv = l.linear_num_value_heads;
        let linear = h * l.conv_dim()
            + h * l.value_dim()
            + 2 * h * nv
            + l.conv_dim() * l.linear_conv_kernel_dim
            + 2 * nv
            + l.linear_value_head_dim
            + l.value_dim() * h;
        let layers: i64 = (0..self.num_hidden_layers.max(0) as usize)
            .map(|l| {
                let mixer = if self.linear_layer(l) { linear } else { attn };
                let norms = if self.sandwich_norms() { 4 * h } else { 2 * h };
                mixer + norms + if self.sparse_layer(l) { sparse } else { dense }
            })
            .sum();
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + layers + h + head
    }
}
