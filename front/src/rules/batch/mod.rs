//! Batch arithmetic: train, mini and micro batch sizes, dynamic batching budgets.

pub(crate) mod arithmetic;
pub(crate) mod derived_size_overflows;
pub(crate) mod dynamic_batching_mismatch;
pub(crate) mod engine_worker_needs_per_gpu_micro_batch;
pub(crate) mod global_micro_batch_below_world_size;
pub(crate) mod megatron_shuffle_without_seed;
pub(crate) mod micro_batch_set_twice;
pub(crate) mod micro_batch_unset;
pub(crate) mod mini_batch_exceeds_train_batch;
pub(crate) mod mini_batch_not_divisible_by_data_parallel;
pub(crate) mod mini_batch_not_divisible_by_global_micro_batch;
pub(crate) mod normalized_mini_batch_is_zero;
pub(crate) mod normalized_mini_batch_not_divisible_by_micro_batch;
pub(crate) mod token_budget_below_sequence_length;
pub(crate) mod train_batch_not_divisible_by_minimal_batch;
