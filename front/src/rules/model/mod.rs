//! The model: options that depend on the backend, and (`V2xx`) checks against the model's
//! `config.json` dimensions.

pub(crate) mod builtin_model_invalid;
pub(crate) mod expert_parallel_does_not_divide_experts;
pub(crate) mod mbridge_required;
pub(crate) mod megatron_float32_extension;
pub(crate) mod pipeline_does_not_divide_layers;
pub(crate) mod ref_load_weight_mismatch;
pub(crate) mod rollout_max_model_len_exceeds_model;
pub(crate) mod sequence_exceeds_model_context;
pub(crate) mod tensor_parallel_does_not_divide_heads;
pub(crate) mod tensor_parallel_incompatible_with_kv_heads;
pub(crate) mod tiled_mlp_without_fsdp2;
