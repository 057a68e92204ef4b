//! Parallel layouts against the cluster size and each other.

pub(crate) mod fsdp_size_does_not_divide_world;
pub(crate) mod megatron_strategy_without_engine_section;
pub(crate) mod megatron_with_ulysses;
pub(crate) mod rollout_expert_parallel_mismatch;
pub(crate) mod rollout_expert_parallel_needs_node_aligned_tensor_parallel;
pub(crate) mod rollout_pipeline_parallel_unsupported;
pub(crate) mod rollout_replica_not_node_aligned;
pub(crate) mod sequence_parallel_without_remove_padding;
pub(crate) mod world_not_divisible_by_model_parallel;
pub(crate) mod world_not_divisible_by_rollout_replica;
pub(crate) mod world_not_divisible_by_sequence_parallel;
