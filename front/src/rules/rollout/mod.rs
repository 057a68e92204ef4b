//! The rollout engine and its sampling settings.

pub(crate) mod lora_rank_above_vllm_limit;
pub(crate) mod name_not_in_release_registry;
pub(crate) mod prometheus_needs_log_stats;
pub(crate) mod rollout_engine_not_registered;
pub(crate) mod rollout_sync_mode_removed;
pub(crate) mod validation_sampling_without_temperature;
