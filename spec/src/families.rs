//! The model families verlc trains: one row each, read by the checks (which `model_type`s
//! exist, which have experts or linear-attention layers), `builtin://tiny` (the `arch=` names)
//! and the runtime's model loader (the family of a `config.json`, transformers' class names).
//! A new family is a row here and its family file in the runtime's model folder.

/// A family, by the causal LM's architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Llama,
    /// Mistral (Mistral-Nemo): Llama's layers with an explicit `head_dim`; its
    /// `sliding_window`, when set, applies to every layer.
    Mistral,
    /// Gemma (the first generation): `1 + weight` norms, embeddings scaled by
    /// `sqrt(hidden_size)`, a GELU-gated MLP, tied embeddings.
    Gemma,
    /// Gemma 2: Gemma's norms, embeddings and GELU with a second norm around each layer's
    /// attention and MLP, soft-capped attention scores and output logits, its own query
    /// scale and every other layer within a sliding window.
    Gemma2,
    /// Seed-OSS: Llama's layers with q/k/v biases, an output-projection bias of its own key
    /// and dropout in training (which verlc refuses unless set to zero).
    SeedOss,
    Qwen2,
    Qwen3,
    /// Qwen3 with sparse mixture-of-experts MLPs.
    Qwen3Moe,
    /// Qwen3.5's text model: Gated DeltaNet linear-attention layers interleaved with gated
    /// full attention, zero-centred RMSNorm, partial rotary.
    Qwen3_5,
    /// Qwen3.5 with a sparse MLP in every layer: routed experts plus a gated shared expert.
    Qwen3_5Moe,
    /// Qwen3-Next: Qwen3.5-MoE's layers (DeltaNet projections stored fused), sparse layers
    /// placed as Qwen3-MoE's.
    Qwen3Next,
    /// Qwen2.5-VL: Qwen2's decoder under multimodal rotary positions (M-RoPE), with a vision
    /// tower whose embeddings fill the prompt's image placeholders.
    Qwen2_5Vl,
    /// Qwen3-VL: Qwen3's decoder under interleaved M-RoPE, with a vision tower whose
    /// embeddings fill the image placeholders and whose DeepStack features are added there to
    /// the first layers' outputs.
    Qwen3Vl,
    /// Qwen3-VL-MoE: Qwen3-MoE's decoder (its experts stored fused, `experts.gate_up_proj` and
    /// `experts.down_proj` holding every expert) with Qwen3-VL's tower and rotary positions.
    Qwen3VlMoe,
    /// Qwen3.5's published (multimodal) checkpoints: Qwen3.5's text model under interleaved
    /// M-RoPE over its partial rotary dimensions, with Qwen3-VL's tower without DeepStack.
    Qwen3_5Vl,
    /// The same with Qwen3.5-MoE's text model.
    Qwen3_5MoeVl,
    /// gpt-oss: attention with a learned sink logit per head, every other layer within a
    /// sliding window, and sparse MLPs whose router and experts carry biases, stored fused
    /// with gate and up columns interleaved, through a clamped SwiGLU.
    GptOss,
}

/// How a family's checkpoints store the routed experts and what an expert computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpertStyle {
    /// No experts, or Qwen3-MoE's: one SwiGLU module per expert
    /// (`mlp.experts.{e}.{gate,up,down}_proj.weight`), an unbiased router `mlp.gate`.
    PerExpert,
    /// Qwen3-VL-MoE's: every expert of a layer in `mlp.experts.gate_up_proj` (gate columns,
    /// then up) and `mlp.experts.down_proj`; the router as [`ExpertStyle::PerExpert`]'s.
    FusedHalves,
    /// gpt-oss's: fused as [`ExpertStyle::FusedHalves`] but with gate and up columns
    /// interleaved, biases beside each (`gate_up_proj_bias`, `down_proj_bias`), a biased router
    /// `mlp.router` whose top-k logits are soft-maxed, and the clamped SwiGLU
    /// `(clamp(up, ±limit) + 1) · g · sigmoid(1.702 g)`, `g = min(gate, limit)`, `limit` the
    /// config's `swiglu_limit`. The experts' width is the config's `intermediate_size` and
    /// their count its `num_local_experts`.
    FusedInterleavedBiased,
}

impl ExpertStyle {
    /// Whether the router and the experts carry biases and the experts compute the clamped
    /// SwiGLU ([`ExpertStyle::FusedInterleavedBiased`]).
    pub fn biased(self) -> bool {
        self == ExpertStyle::FusedInterleavedBiased
    }
}

/// The vision towers, each a file of the runtime's vision folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VisionTower {
    /// Window attention, 2-D rotary, a patch merger (`qwen2_5_vl.rs`); M-RoPE in blocks.
    Qwen2_5Vl,
    /// A learned position grid, whole-image attention, DeepStack mergers (`qwen3_vl.rs`);
    /// interleaved M-RoPE.
    Qwen3Vl,
    /// Qwen3.5's: Qwen3-VL's without the DeepStack mergers (`qwen3_vl.rs`); interleaved M-RoPE.
    Qwen3_5,
}

impl VisionTower {
    /// Whether its families' checkpoints name their weights by transformers' module tree
    /// (`model.language_model.*`, `model.visual.*`): transformers reads Qwen3-VL's and
    /// Qwen3.5's only so, while Qwen2.5-VL's own files (`model.*`, `visual.*`) are renamed on
    /// load.
    pub fn module_tree_names(self) -> bool {
        self != VisionTower::Qwen2_5Vl
    }

    /// Whether its families' multimodal rotary positions interleave the three axes over the
    /// frequencies (Qwen3-VL's layout) rather than give each a contiguous section.
    pub fn interleaved_mrope(self) -> bool {
        self != VisionTower::Qwen2_5Vl
    }

    /// Whether it feeds DeepStack features to the text model's first layers.
    pub fn deepstack(self) -> bool {
        self == VisionTower::Qwen3Vl
    }

    /// Whether it is a Qwen3-VL-style tower (`qwen3_vl.rs`: a learned position grid, whole-image
    /// attention).
    pub fn qwen3_style(self) -> bool {
        self != VisionTower::Qwen2_5Vl
    }

    /// Whether its families' processor (`Qwen3VLProcessor`, Qwen3.5's too) puts each temporal
    /// patch of a video apart in the prompt, behind its timestamp, and bounds the whole video's
    /// pixels (`Qwen3VLVideoProcessor`), rather than Qwen2-VL's one span per video.
    pub fn timestamped_videos(self) -> bool {
        self.qwen3_style()
    }
}

/// The `hidden_act` names a dense gated MLP takes (transformers' `ACT2FN` names: SiLU, GELU by
/// the error function, GELU's tanh approximation).
pub const GATE_ACTIVATIONS: &[&str] = &["silu", "swish", "gelu", "gelu_pytorch_tanh"];

/// The `hidden_act` names a family with experts takes (its experts are SwiGLU).
pub const EXPERT_ACTIVATIONS: &[&str] = &["silu", "swish"];

/// The dropouts transformers applies in training mode (verl's updates), which verlc's models do
/// not have: a trained model must set them to zero.
pub const DROPOUT_KEYS: &[&str] = &["attention_dropout", "residual_dropout"];

/// A value of a `config.json` key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ConfigValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'static str),
}

/// What is known of a family without loading a model.
#[derive(Debug)]
pub struct FamilyRow {
    pub family: Family,
    /// What users call it.
    pub name: &'static str,
    /// The `model_type` of its checkpoints' `config.json`.
    pub model_type: &'static str,
    /// transformers' class of the causal LM (`architectures`).
    pub causal_lm_class: &'static str,
    /// transformers' class of the value model (token classification, one label).
    pub value_class: &'static str,
    /// Sparse mixture-of-experts MLPs.
    pub experts: bool,
    /// A gated shared expert beside the routed ones.
    pub shared_expert: bool,
    /// Gated DeltaNet (linear-attention) layers among gated attention.
    pub linear_attention: bool,
    /// RMSNorm on per-head queries and keys.
    pub qk_norm: bool,
    /// The q/k/v projections always carry biases and the output projection never does
    /// (Qwen2); the others follow the config's `attention_bias` for all four.
    pub qkv_bias: bool,
    /// The output projection's bias is the config's `attention_out_bias` (Seed-OSS), apart
    /// from the q/k/v projections' `attention_bias`.
    pub attention_out_bias: bool,
    /// The config's `sliding_window`, unless null, limits every layer's attention (Mistral
    /// 7B v0.1's 4,096; Mistral-Nemo's is null); the others apply it only under
    /// `use_sliding_window`, which verlc refuses.
    pub sliding_window_unless_null: bool,
    /// `use_sliding_window` windows the layers from the config's `max_window_layers` on
    /// (those `layer_types` names `sliding_attention`), within `sliding_window` (Qwen2, Qwen3);
    /// a family without this setting refuses `use_sliding_window`.
    pub max_window_layers: bool,
    /// The layers `layer_types` names `sliding_attention` attend within the config's
    /// `sliding_window` (each query the keys less than that many positions before it).
    pub sliding_layers: bool,
    /// Each attention head has a learned sink logit (`self_attn.sinks`) that joins the
    /// softmax's denominator and attends to nothing.
    pub attention_sinks: bool,
    /// How the routed experts are stored and computed (families with experts).
    pub expert_style: ExpertStyle,
    /// RMSNorm scales by `1 + weight` (weights start at zero) in float32 and casts after
    /// (Gemma, Qwen3.5).
    pub norm_plus_one: bool,
    /// The token embeddings are multiplied by `sqrt(hidden_size)`, rounded to the model's
    /// dtype, before the first layer (Gemma).
    pub scaled_embedding: bool,
    /// Each layer also norms its token mixer's output (`post_attention_layernorm`) and its
    /// MLP's output (`post_feedforward_layernorm`) before the residual adds, the MLP's input
    /// being normed by `pre_feedforward_layernorm` (Gemma 2).
    pub sandwich_norms: bool,
    /// The config's `attn_logit_softcapping` caps each attention score and its
    /// `final_logit_softcapping` each output logit (`cap · tanh(x / cap)`, either null for
    /// none), and its `query_pre_attn_scalar` `s` sets the attention scale to `1 / sqrt(s)`
    /// (Gemma 2).
    pub soft_capping: bool,
    /// The `config.json` key naming the MLP's gate activation (`hidden_act`; Gemma 2 reads
    /// `hidden_activation`).
    pub activation_key: &'static str,
    /// Its chat template is ChatML (`<|im_start|>`/`<|im_end|>` turns), whose turn junction
    /// the tool agent loop inserts between turns.
    pub chatml: bool,
    /// A vision tower beside the text model (`vision_config`): images in the prompt's
    /// placeholder tokens, multimodal rotary positions.
    pub vision: Option<VisionTower>,
    /// What transformers' config class takes for keys `config.json` may leave out, where it
    /// differs from the common defaults (no `head_dim`: hidden / heads; `hidden_act` silu;
    /// embeddings untied; no biases; no dropout).
    pub config_defaults: &'static [(&'static str, ConfigValue)],
    /// Its name in `builtin://tiny?arch=`.
    pub tiny_arch: &'static str,
    /// The family whose layers its text model has (itself, except for a multimodal family
    /// built on a text family's layers and settings: Qwen3.5's checkpoints).
    pub text: Family,
}

/// Every family, one row each.
pub static FAMILIES: &[FamilyRow] = &[
    FamilyRow {
        family: Family::Llama,
        name: "Llama",
        model_type: "llama",
        causal_lm_class: "LlamaForCausalLM",
        value_class: "LlamaForTokenClassification",
        experts: false,
        shared_expert: false,
        linear_attention: false,
        qk_norm: false,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: false,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: false,
        vision: None,
        config_defaults: &[],
        tiny_arch: "llama",
        text: Family::Llama,
    },
    FamilyRow {
        family: Family::Mistral,
        name: "Mistral",
        model_type: "mistral",
        causal_lm_class: "MistralForCausalLM",
        value_class: "MistralForTokenClassification",
        experts: false,
        shared_expert: false,
        linear_attention: false,
        qk_norm: false,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: true,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: false,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: false,
        vision: None,
        config_defaults: &[],
        tiny_arch: "mistral",
        text: Family::Mistral,
    },
    FamilyRow {
        family: Family::Gemma,
        name: "Gemma",
        model_type: "gemma",
        causal_lm_class: "GemmaForCausalLM",
        value_class: "GemmaForTokenClassification",
        experts: false,
        shared_expert: false,
        linear_attention: false,
        qk_norm: false,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: true,
        scaled_embedding: true,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: false,
        vision: None,
        config_defaults: &[
            ("head_dim", ConfigValue::Int(256)),
            ("hidden_act", ConfigValue::Str("gelu_pytorch_tanh")),
            ("tie_word_embeddings", ConfigValue::Bool(true)),
        ],
        tiny_arch: "gemma",
        text: Family::Gemma,
    },
    FamilyRow {
        family: Family::Gemma2,
        name: "Gemma 2",
        model_type: "gemma2",
        causal_lm_class: "Gemma2ForCausalLM",
        value_class: "Gemma2ForTokenClassification",
        experts: false,
        shared_expert: false,
        linear_attention: false,
        qk_norm: false,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: true,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: true,
        scaled_embedding: true,
        sandwich_norms: true,
        soft_capping: true,
        activation_key: "hidden_activation",
        chatml: false,
        vision: None,
        config_defaults: &[
            ("head_dim", ConfigValue::Int(256)),
            ("hidden_activation", ConfigValue::Str("gelu_pytorch_tanh")),
            ("tie_word_embeddings", ConfigValue::Bool(true)),
            ("sliding_window", ConfigValue::Int(4096)),
            ("query_pre_attn_scalar", ConfigValue::Int(256)),
            ("attn_logit_softcapping", ConfigValue::Float(50.0)),
            ("final_logit_softcapping", ConfigValue::Float(30.0)),
        ],
        tiny_arch: "gemma2",
        text: Family::Gemma2,
    },
    FamilyRow {
        family: Family::SeedOss,
        name: "Seed-OSS",
        model_type: "seed_oss",
        causal_lm_class: "SeedOssForCausalLM",
        value_class: "SeedOssForTokenClassification",
        experts: false,
        shared_expert: false,
        linear_attention: false,
        qk_norm: false,
        qkv_bias: false,
        attention_out_bias: true,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: false,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: false,
        vision: None,
        config_defaults: &[
            ("head_dim", ConfigValue::Int(128)),
            ("attention_bias", ConfigValue::Bool(true)),
            ("attention_dropout", ConfigValue::Float(0.1)),
            ("residual_dropout", ConfigValue::Float(0.1)),
        ],
        tiny_arch: "seed_oss",
        text: Family::SeedOss,
    },
    FamilyRow {
        family: Family::Qwen2,
        name: "Qwen2",
        model_type: "qwen2",
        causal_lm_class: "Qwen2ForCausalLM",
        value_class: "Qwen2ForTokenClassification",
        experts: false,
        shared_expert: false,
        linear_attention: false,
        qk_norm: false,
        qkv_bias: true,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: true,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: false,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: None,
        config_defaults: &[],
        tiny_arch: "qwen2",
        text: Family::Qwen2,
    },
    FamilyRow {
        family: Family::Qwen3,
        name: "Qwen3",
        model_type: "qwen3",
        causal_lm_class: "Qwen3ForCausalLM",
        value_class: "Qwen3ForTokenClassification",
        experts: false,
        shared_expert: false,
        linear_attention: false,
        qk_norm: true,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: true,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: false,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: None,
        config_defaults: &[("head_dim", ConfigValue::Int(128))],
        tiny_arch: "qwen3",
        text: Family::Qwen3,
    },
    FamilyRow {
        family: Family::Qwen3Moe,
        name: "Qwen3-MoE",
        model_type: "qwen3_moe",
        causal_lm_class: "Qwen3MoeForCausalLM",
        value_class: "Qwen3MoeForTokenClassification",
        experts: true,
        shared_expert: false,
        linear_attention: false,
        qk_norm: true,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: false,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: None,
        config_defaults: &[],
        tiny_arch: "qwen3_moe",
        text: Family::Qwen3Moe,
    },
    FamilyRow {
        family: Family::Qwen3_5,
        name: "Qwen3.5",
        model_type: "qwen3_5_text",
        causal_lm_class: "Qwen3_5ForCausalLM",
        value_class: "Qwen3_5ForTokenClassification",
        experts: false,
        shared_expert: false,
        linear_attention: true,
        qk_norm: true,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: true,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: None,
        config_defaults: &[],
        tiny_arch: "qwen3_5",
        text: Family::Qwen3_5,
    },
    FamilyRow {
        family: Family::Qwen3_5Moe,
        name: "Qwen3.5-MoE",
        model_type: "qwen3_5_moe_text",
        causal_lm_class: "Qwen3_5MoeForCausalLM",
        value_class: "Qwen3_5MoeForTokenClassification",
        experts: true,
        shared_expert: true,
        linear_attention: true,
        qk_norm: true,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: true,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: None,
        config_defaults: &[],
        tiny_arch: "qwen3_5_moe",
        text: Family::Qwen3_5Moe,
    },
    FamilyRow {
        family: Family::Qwen3Next,
        name: "Qwen3-Next",
        model_type: "qwen3_next",
        causal_lm_class: "Qwen3NextForCausalLM",
        value_class: "Qwen3NextForTokenClassification",
        experts: true,
        shared_expert: true,
        linear_attention: true,
        qk_norm: true,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: true,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: None,
        config_defaults: &[],
        tiny_arch: "qwen3_next",
        text: Family::Qwen3Next,
    },
    FamilyRow {
        family: Family::Qwen2_5Vl,
        name: "Qwen2.5-VL",
        model_type: "qwen2_5_vl",
        causal_lm_class: "Qwen2_5_VLForConditionalGeneration",
        // transformers has no token-classification head for it: a critic is refused.
        value_class: "Qwen2_5_VLForConditionalGeneration",
        experts: false,
        shared_expert: false,
        linear_attention: false,
        qk_norm: false,
        qkv_bias: true,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: false,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: Some(VisionTower::Qwen2_5Vl),
        config_defaults: &[],
        tiny_arch: "qwen2_5_vl",
        text: Family::Qwen2_5Vl,
    },
    FamilyRow {
        family: Family::Qwen3Vl,
        name: "Qwen3-VL",
        model_type: "qwen3_vl",
        causal_lm_class: "Qwen3VLForConditionalGeneration",
        // transformers has no token-classification head for it: a critic is refused.
        value_class: "Qwen3VLForConditionalGeneration",
        experts: false,
        shared_expert: false,
        linear_attention: false,
        qk_norm: true,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: false,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: Some(VisionTower::Qwen3Vl),
        config_defaults: &[("head_dim", ConfigValue::Int(128))],
        tiny_arch: "qwen3_vl",
        text: Family::Qwen3Vl,
    },
    FamilyRow {
        family: Family::Qwen3VlMoe,
        name: "Qwen3-VL-MoE",
        model_type: "qwen3_vl_moe",
        causal_lm_class: "Qwen3VLMoeForConditionalGeneration",
        // transformers has no token-classification head for it: a critic is refused.
        value_class: "Qwen3VLMoeForConditionalGeneration",
        experts: true,
        shared_expert: false,
        linear_attention: false,
        qk_norm: true,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::FusedHalves,
        norm_plus_one: false,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: Some(VisionTower::Qwen3Vl),
        config_defaults: &[],
        tiny_arch: "qwen3_vl_moe",
        text: Family::Qwen3VlMoe,
    },
    FamilyRow {
        family: Family::Qwen3_5Vl,
        name: "Qwen3.5 (image-text)",
        model_type: "qwen3_5",
        causal_lm_class: "Qwen3_5ForConditionalGeneration",
        // transformers 5's token classifier of the image-text config.
        value_class: "Qwen3_5ForTokenClassification",
        experts: false,
        shared_expert: false,
        linear_attention: true,
        qk_norm: true,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: true,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: Some(VisionTower::Qwen3_5),
        config_defaults: &[],
        tiny_arch: "qwen3_5_vl",
        text: Family::Qwen3_5,
    },
    FamilyRow {
        family: Family::Qwen3_5MoeVl,
        name: "Qwen3.5-MoE (image-text)",
        model_type: "qwen3_5_moe",
        causal_lm_class: "Qwen3_5MoeForConditionalGeneration",
        // transformers has no token classifier of it; verlc's critic is the text model's.
        value_class: "Qwen3_5MoeForTokenClassification",
        experts: true,
        shared_expert: true,
        linear_attention: true,
        qk_norm: true,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: false,
        attention_sinks: false,
        expert_style: ExpertStyle::PerExpert,
        norm_plus_one: true,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: true,
        vision: Some(VisionTower::Qwen3_5),
        config_defaults: &[],
        tiny_arch: "qwen3_5_moe_vl",
        text: Family::Qwen3_5Moe,
    },
    FamilyRow {
        family: Family::GptOss,
        name: "gpt-oss",
        model_type: "gpt_oss",
        causal_lm_class: "GptOssForCausalLM",
        value_class: "GptOssForTokenClassification",
        experts: true,
        shared_expert: false,
        linear_attention: false,
        qk_norm: false,
        qkv_bias: false,
        attention_out_bias: false,
        sliding_window_unless_null: false,
        max_window_layers: false,
        sliding_layers: true,
        attention_sinks: true,
        expert_style: ExpertStyle::FusedInterleavedBiased,
        norm_plus_one: false,
        scaled_embedding: false,
        sandwich_norms: false,
        soft_capping: false,
        activation_key: "hidden_act",
        chatml: false,
        vision: None,
        config_defaults: &[
            ("head_dim", ConfigValue::Int(64)),
            ("attention_bias", ConfigValue::Bool(true)),
            ("sliding_window", ConfigValue::Int(128)),
            ("swiglu_limit", ConfigValue::Float(7.0)),
        ],
        tiny_arch: "gpt_oss",
        text: Family::GptOss,
    },
];

impl Family {
    /// Its row of [`FAMILIES`].
    pub fn row(self) -> &'static FamilyRow {
        FAMILIES
            .iter()
            .find(|r| r.family == self)
            .unwrap_or(&FAMILIES[0])
    }

    /// The family of a checkpoint's `model_type`.
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        FAMILIES
            .iter()
            .find(|r| r.model_type == model_type)
            .map(|r| r.family)
    }

    /// Families with sparse mixture-of-experts MLPs.
    pub fn has_experts(self) -> bool {
        self.row().experts
    }

    /// Qwen3.5's families and Qwen3-Next, which shares their layers (Gated DeltaNet layers
    /// among gated attention).
    pub fn is_qwen3_5(self) -> bool {
        self.row().linear_attention
    }

    pub fn causal_lm_class(self) -> &'static str {
        self.row().causal_lm_class
    }

    pub fn value_class(self) -> &'static str {
        self.row().value_class
    }

    pub fn qk_norm(self) -> bool {
        self.row().qk_norm
    }

    /// Families with a vision tower.
    pub fn has_vision(self) -> bool {
        self.row().vision.is_some()
    }

    /// Its vision tower, if it has one.
    pub fn tower(self) -> Option<VisionTower> {
        self.row().vision
    }

    /// The family whose layers and settings its text model has.
    pub fn text(self) -> Family {
        self.row().text
    }
}

impl FamilyRow {
    /// The config class's value of `key` where `config.json` leaves it out, if the family
    /// has its own (see [`FamilyRow::config_defaults`]).
    pub fn config_default(&self, key: &str) -> Option<ConfigValue> {
        self.config_defaults
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }

    /// The head width without a `head_dim` key (`None`: hidden / heads).
    pub fn default_head_dim(&self) -> Option<i64> {
        match self.config_default("head_dim") {
            Some(ConfigValue::Int(d)) => Some(d),
            _ => None,
        }
    }

    /// Whether the boolean `key` is true without the key in `config.json`.
    pub fn default_flag(&self, key: &str) -> bool {
        self.config_default(key) == Some(ConfigValue::Bool(true))
    }

    /// Whether its attention needs more than libtorch's fused kernel computes (sink logits,
    /// layers within a sliding window, soft-capped scores): computed in full, and under Megatron only while each
    /// rank's queries are the last of its keys (no context parallelism).
    pub fn eager_attention(&self) -> bool {
        self.attention_sinks || self.sliding_layers || self.soft_capping
    }

    /// Whether the embeddings are tied without a `tie_word_embeddings` key.
    pub fn tied_by_default(&self) -> bool {
        self.default_flag("tie_word_embeddings")
    }
}

/// The row of a checkpoint's `model_type`.
pub fn of_checkpoint(model_type: &str) -> Option<&'static FamilyRow> {
    FAMILIES.iter().find(|r| r.model_type == model_type)
}

/// Every `model_type` a checkpoint of a family may carry.
pub fn checkpoint_model_types() -> Vec<&'static str> {
    FAMILIES.iter().map(|r| r.model_type).collect()
}

/// The row of a `builtin://tiny` `arch=` name.
pub fn of_tiny_arch(arch: &str) -> Option<&'static FamilyRow> {
    FAMILIES.iter().find(|r| r.tiny_arch == arch)
}

/// The `arch=` names `builtin://tiny` takes.
pub fn tiny_archs() -> Vec<&'static str> {
    FAMILIES.iter().map(|r| r.tiny_arch).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_has_one_row_and_distinct_names() {
        for (i, r) in FAMILIES.iter().enumerate() {
            assert_eq!(r.family.row().model_type, r.model_type);
            for other in &FAMILIES[i + 1..] {
                assert_ne!(r.family, other.family);
                assert_ne!(r.model_type, other.model_type);
                assert_ne!(r.tiny_arch, other.tiny_arch);
            }
        }
        // Qwen3.5's published checkpoints are image-text models on its text model's layers.
        let qwen3_5 = of_checkpoint("qwen3_5").expect("a row");
        assert_eq!(qwen3_5.family, Family::Qwen3_5Vl);
        assert_eq!(qwen3_5.text, Family::Qwen3_5);
        assert_eq!(Family::Qwen3_5MoeVl.row().text, Family::Qwen3_5Moe);
        for r in FAMILIES {
            // A text family is its own; a family built on another's layers shares its flags.
            let text = r.text.row();
            assert_eq!(text.text, text.family, "{}", r.name);
            assert_eq!(
                (text.experts, text.linear_attention, text.qk_norm),
                (r.experts, r.linear_attention, r.qk_norm),
                "{}",
                r.name
            );
        }
        assert!(of_checkpoint("gemma3").is_none());
        assert_eq!(
            of_checkpoint("gemma").and_then(FamilyRow::default_head_dim),
            Some(256)
        );
        assert!(of_checkpoint("gemma").is_some_and(FamilyRow::tied_by_default));
    }
}
