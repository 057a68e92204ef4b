//! The Hugging Face model shared by actor, rollout and reference policy,
//! `actor_rollout_ref.model` (group `model/hf_model.yaml`), and the Megatron LoRA settings
//! that the Megatron trainer adds to it (also used by the Megatron critic).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{OneOrMany, OpenDict, TiledMlpConfig};
use super::engine::TorchDtype;

/// Implementation of the fused log-prob/entropy kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FusedKernelBackend {
    /// Plain PyTorch implementation.
    #[serde(rename = "torch")]
    Torch,
    /// Triton kernels.
    #[serde(rename = "triton")]
    Triton,
}

/// Options of the fused kernels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FusedKernelOptions {
    /// Kernel implementation used when `use_fused_kernels` is on.
    pub impl_backend: FusedKernelBackend,
}

/// Kind of Megatron parameter-efficient adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum LoraType {
    /// Standard LoRA on fused projection layers.
    #[serde(rename = "lora")]
    Lora,
    /// LoRA for vision-language models, with freezing controls per tower.
    #[serde(rename = "vlm_lora")]
    VlmLora,
    /// LoRA on separate q/k/v and gate/up projections.
    #[serde(rename = "canonical_lora")]
    CanonicalLora,
    /// Weight-decomposed LoRA (DoRA).
    #[serde(rename = "dora")]
    Dora,
}

/// Where adapter dropout is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum LoraDropoutPosition {
    /// Before the adapter's down projection.
    #[serde(rename = "pre")]
    Pre,
    /// After the adapter's up projection.
    #[serde(rename = "post")]
    Post,
}

/// Megatron LoRA adapter settings. Every key is optional: verl falls back to its own default
/// for a missing one, and with FSDP only `rank` and `merge` are read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// Adapter kind.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub kind: Option<LoraType>,
    /// Adapter rank; 0 disables LoRA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub rank: Option<i64>,
    /// Adapter scaling numerator (the update is scaled by alpha / rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f64>,
    /// Dropout probability inside the adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub dropout: Option<f64>,
    /// Megatron module names that receive adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_modules: Option<Vec<String>>,
    /// Module names excluded from adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_modules: Option<Vec<String>>,
    /// Where dropout is applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropout_position: Option<LoraDropoutPosition>,
    /// Initialisation of the down projection (e.g. `xavier`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "lora_A_init_method"
    )]
    pub lora_a_init_method: Option<String>,
    /// Initialisation of the up projection (e.g. `zero`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "lora_B_init_method"
    )]
    pub lora_b_init_method: Option<String>,
    /// Experimental all-to-all communication for expert adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a_experimental: Option<bool>,
    /// Adapter dtype; null uses the model's dtype.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<TorchDtype>,
    /// Pretrained adapter to start from; null starts from fresh adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_path: Option<String>,
    /// `vlm_lora`: keep the vision encoder frozen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze_vision_model: Option<bool>,
    /// `vlm_lora`: keep the vision projection frozen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze_vision_projection: Option<bool>,
    /// `vlm_lora`: keep the language model's base weights frozen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze_language_model: Option<bool>,
    /// Merge the adapters into the base weights before syncing them to the rollout engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<bool>,
}

/// The Hugging Face model of the policy: where it comes from, how it is patched, and its
/// (FSDP) LoRA settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HfModelConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Local folder, hub id or remote path of the model.
    pub path: String,
    /// Where to read `config.json` from; null uses `path`.
    pub hf_config_path: Option<String>,
    /// Where to read the tokenizer from; null uses `path`.
    pub tokenizer_path: Option<String>,
    /// Stage the weights in shared memory (`/dev/shm`) to speed up loading.
    pub use_shm: bool,
    /// Allow running Python code shipped with the model or tokenizer.
    pub trust_remote_code: bool,
    /// Jinja chat template replacing the tokenizer's own.
    pub custom_chat_template: Option<String>,
    /// Python module imported before loading, to register custom model classes.
    pub external_lib: Option<String>,
    /// Entries merged into the Hugging Face model config (e.g. `attn_implementation`).
    pub override_config: OpenDict,
    /// Recompute activations in backward to save memory.
    pub enable_gradient_checkpointing: bool,
    /// Move checkpointed activations to host memory.
    pub enable_activation_offload: bool,
    /// Pack sequences without padding tokens (needs a flash-attention capable model).
    pub use_remove_padding: bool,
    /// FSDP LoRA rank; 0 trains all weights.
    #[schemars(range(min = 0))]
    pub lora_rank: i64,
    /// FSDP LoRA scaling numerator.
    pub lora_alpha: i64,
    /// FSDP LoRA target modules: `all-linear` or a list of module names.
    pub target_modules: Option<OneOrMany<String>>,
    /// FSDP LoRA modules to leave out.
    pub exclude_modules: Option<OneOrMany<String>>,
    /// Pretrained LoRA adapter to start from.
    pub lora_adapter_path: Option<String>,
    /// Patch the model with Liger kernels.
    pub use_liger: bool,
    /// Use fused kernels for the log-prob/entropy head.
    pub use_fused_kernels: bool,
    /// Options of the fused kernels.
    pub fused_kernel_options: FusedKernelOptions,
    /// Tiled MLP.
    pub tiled_mlp: TiledMlpConfig,
    /// Megatron LoRA adapters (added by the Megatron trainer); with FSDP, `rank` and `merge`
    /// may be given here too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}
