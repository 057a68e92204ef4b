//! Reward manager and reward model.

pub(crate) mod reward_manager_not_registered;
pub(crate) mod reward_pool_size_not_positive;
