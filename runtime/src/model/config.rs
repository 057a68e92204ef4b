//! `config.json` of a Llama / Qwen2 / Qwen3 / Qwen3-MoE checkpoint. Field names are the Hugging Face keys;
//! keys this crate does not use are kept in `extra` so a saved config round-trips.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ModelError;

/// The architectures of the decoder family, from `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    /// Qwen3 with sparse mixture-of-experts MLPs ([`MoeConfig`]).
    Qwen3Moe,
}

impl Arch {
    /// The `architectures` entry transformers expects for the causal LM.
    pub fn causal_lm_class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Qwen3Moe => "Qwen3MoeForCausalLM",
        }
    }

    /// The `architectures` entry for the value model (token classification, one label).
    pub fn value_class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForTokenClassification",
            Arch::Qwen2 => "Qwen2ForTokenClassification",
            Arch::Qwen3 => "Qwen3ForTokenClassification",
            Arch::Qwen3Moe => "Qwen3MoeForTokenClassification",
        }
    }
}

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
    #[serde(default, skip_serializing_if = "is_zero")]
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
        }
    }
}

/// The model hyper-parameters, as written in `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub model_type: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
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
        cfg.lora = self.lora.clone();
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let cfg: ModelConfig = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            file: path.to_owned(),
            msg: e.to_string(),
        })?;
        cfg.validate().map_err(|msg| ModelError::Config {
            file: path.to_owned(),
            msg,
        })?;
        Ok(cfg)
    }

    /// Checks that the family supports this configuration.
    pub fn validate(&self) -> Result<(), String> {
        self.arch()?;
        if self.hidden_act != "silu" {
            return Err(format!(
                "hidden_act `{}` is not supported (only silu)",
                self.hidden_act
            ));
        }
        if self.use_sliding_window {
            return Err("use_sliding_window = true is not supported".to_owned());
        }
        let pos = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
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
        self.validate_moe()
    }

    /// The expert keys: required and consistent for `qwen3_moe`, absent otherwise.
    fn validate_moe(&self) -> Result<(), String> {
        let m = &self.moe;
        if self.arch()? != Arch::Qwen3Moe {
            if m.num_experts != 0 {
                return Err(format!(
                    "num_experts = {} on model_type `{}`: experts are implemented for qwen3_moe",
                    m.num_experts, self.model_type
                ));
            }
            return Ok(());
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

    pub fn arch(&self) -> Result<Arch, String> {
        match self.model_type.as_str() {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "qwen3_moe" => Ok(Arch::Qwen3Moe),
            other => Err(format!(
                "model_type `{other}` is not supported (llama, qwen2, qwen3, qwen3_moe)"
            )),
        }
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
        self.model_type == "qwen2" || self.attention_bias.unwrap_or(false)
    }

    /// Bias on the output projection (`attention_bias` of Llama and Qwen3; never for Qwen2).
    pub fn o_bias(&self) -> bool {
        self.model_type != "qwen2" && self.attention_bias.unwrap_or(false)
    }

    /// RMSNorm on per-head queries and keys (Qwen3).
    pub fn qk_norm(&self) -> bool {
        self.model_type == "qwen3" || self.model_type == "qwen3_moe"
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
        let mut attn = h * q + 2 * h * kv + q * h;
        if self.qkv_bias() {
            attn += q + 2 * kv;
        }
        if self.o_bias() {
            attn += h;
        }
        if self.qk_norm() {
            attn += 2 * hd;
        }
        let dense = 3 * h * i + if self.mlp_bias { 2 * i + h } else { 0 };
        let m = &self.moe;
        let sparse = m.num_experts * (h + 3 * h * m.moe_intermediate_size);
        let layers: i64 = (0..self.num_hidden_layers.max(0) as usize)
            .map(|l| attn + 2 * h + if self.sparse_layer(l) { sparse } else { dense })
            .sum();
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + layers + h + head
    }
}
