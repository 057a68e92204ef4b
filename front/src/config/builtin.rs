//! verlc's built-in default tree (`front/defaults/`), embedded in the binary.
//!
//! The files mirror the group layout of verl 0.7.0's `verl/trainer/config/` for everything
//! the two PPO entry configs (`ppo_trainer.yaml`, `ppo_megatron_trainer.yaml`) and the SFT
//! trainer's (`sft_trainer_engine.yaml`, its profiler and VeOmni options, and the legacy
//! `sft_trainer.yaml`, derived from verl's files by `scripts/builtin_tree.py`) compose: the
//! same file names, `defaults:` lists, keys, default values and interpolations, so composing
//! a short user config gives the tree verl would. Like verl, the tree leaves
//! `actor_rollout_ref.rollout.name` mandatory (`???`); verlc's own engine is `verlc`.

/// Every default file as (path relative to the defaults root, file text), sorted by path.
pub static BUILTIN_FILES: &[(&str, &str)] = &[
    (
        "actor/actor.yaml",
        include_str!("../../defaults/actor/actor.yaml"),
    ),
    (
        "actor/dp_actor.yaml",
        include_str!("../../defaults/actor/dp_actor.yaml"),
    ),
    (
        "actor/megatron_actor.yaml",
        include_str!("../../defaults/actor/megatron_actor.yaml"),
    ),
    (
        "algorithm/rollout_correction.yaml",
        include_str!("../../defaults/algorithm/rollout_correction.yaml"),
    ),
    (
        "critic/critic.yaml",
        include_str!("../../defaults/critic/critic.yaml"),
    ),
    (
        "critic/dp_critic.yaml",
        include_str!("../../defaults/critic/dp_critic.yaml"),
    ),
    (
        "critic/megatron_critic.yaml",
        include_str!("../../defaults/critic/megatron_critic.yaml"),
    ),
    (
        "data/legacy_data.yaml",
        include_str!("../../defaults/data/legacy_data.yaml"),
    ),
    (
        "engine/fsdp.yaml",
        include_str!("../../defaults/engine/fsdp.yaml"),
    ),
    (
        "engine/megatron.yaml",
        include_str!("../../defaults/engine/megatron.yaml"),
    ),
    (
        "engine/veomni.yaml",
        include_str!("../../defaults/engine/veomni.yaml"),
    ),
    (
        "model/hf_model.yaml",
        include_str!("../../defaults/model/hf_model.yaml"),
    ),
    (
        "optim/fsdp.yaml",
        include_str!("../../defaults/optim/fsdp.yaml"),
    ),
    (
        "optim/megatron.yaml",
        include_str!("../../defaults/optim/megatron.yaml"),
    ),
    (
        "optim/veomni.yaml",
        include_str!("../../defaults/optim/veomni.yaml"),
    ),
    (
        "ppo_megatron_trainer.yaml",
        include_str!("../../defaults/ppo_megatron_trainer.yaml"),
    ),
    (
        "ppo_trainer.yaml",
        include_str!("../../defaults/ppo_trainer.yaml"),
    ),
    (
        "profiler/profiler.yaml",
        include_str!("../../defaults/profiler/profiler.yaml"),
    ),
    (
        "ref/dp_ref.yaml",
        include_str!("../../defaults/ref/dp_ref.yaml"),
    ),
    (
        "ref/megatron_ref.yaml",
        include_str!("../../defaults/ref/megatron_ref.yaml"),
    ),
    ("ref/ref.yaml", include_str!("../../defaults/ref/ref.yaml")),
    (
        "reward_manager.yaml",
        include_str!("../../defaults/reward_manager.yaml"),
    ),
    (
        "reward_model/dp_reward_loop.yaml",
        include_str!("../../defaults/reward_model/dp_reward_loop.yaml"),
    ),
    (
        "reward_model/dp_reward_model.yaml",
        include_str!("../../defaults/reward_model/dp_reward_model.yaml"),
    ),
    (
        "reward_model/megatron_reward_loop.yaml",
        include_str!("../../defaults/reward_model/megatron_reward_loop.yaml"),
    ),
    (
        "reward_model/megatron_reward_model.yaml",
        include_str!("../../defaults/reward_model/megatron_reward_model.yaml"),
    ),
    (
        "reward_model/reward_model.yaml",
        include_str!("../../defaults/reward_model/reward_model.yaml"),
    ),
    (
        "rollout/rollout.yaml",
        include_str!("../../defaults/rollout/rollout.yaml"),
    ),
    (
        "sft_trainer_engine.yaml",
        include_str!("../../defaults/sft_trainer_engine.yaml"),
    ),
    (
        "sft_trainer.yaml",
        include_str!("../../defaults/sft_trainer.yaml"),
    ),
];

include!(concat!(env!("OUT_DIR"), "/release_trees.rs"));

/// The files of the built-in tree of `release` (as `front/releases/verl-<release>/` holds
/// them, embedded by build.rs); none for a release verlc carries no tree of.
pub fn release_tree(release: &str) -> &'static [(&'static str, &'static str)] {
    RELEASE_TREES
        .iter()
        .find(|(r, _)| *r == release)
        .map_or(&[], |(_, files)| *files)
}

/// The text of the built-in file at `path` (relative, with `.yaml`), if there is one.
pub fn builtin_file(path: &str) -> Option<&'static str> {
    BUILTIN_FILES
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, text)| *text)
}

#[cfg(test)]
#[path = "builtin_tests.rs"]
mod tests;
