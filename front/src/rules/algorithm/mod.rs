//! The RL algorithm: advantage estimators, KL control, rollout correction.

pub(crate) mod adaptive_kl_horizon_not_positive;
pub(crate) mod dro_without_beta;
pub(crate) mod filter_groups_metric_unavailable;
pub(crate) mod gae_without_critic;
pub(crate) mod gdpo_reward_keys_invalid;
pub(crate) mod group_baseline_with_single_response;
pub(crate) mod importance_threshold_invalid;
pub(crate) mod optimal_baseline_without_sum_pi_squared;
pub(crate) mod pass_at_k_with_single_response;
pub(crate) mod rejection_sampling_option_unknown;
pub(crate) mod rejection_sampling_threshold_invalid;
pub(crate) mod remax_without_baseline_in_v1;
pub(crate) mod straight_through_kl_raises_in_verl;
pub(crate) mod value_from_later_release;
pub(crate) mod vectorized_grpo_ignores_std_flag;
