//! The keys verl moved or dropped between 0.7.0 and 0.9.1, from the releases' own config
//! trees and config dataclasses (`verl/trainer/config`, `verl/workers/config` of each release),
//! each with the release (to the patch) whose tree no longer has it.

/// Where a 0.7.0 key went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The key (or, ending in `.*`, every key under it) in the 0.7.0 layout.
    pub from: &'static str,
    /// Its place in the newer layout (`.*` moves the subtree); `None`: dropped.
    pub to: Option<&'static str>,
    /// The release that made the change.
    pub release: &'static str,
    /// For a dropped key: why, or what replaces it.
    pub note: &'static str,
}

const fn moved(from: &'static str, to: &'static str, release: &'static str) -> Move {
    Move {
        from,
        to: Some(to),
        release,
        note: "",
    }
}

const fn dropped(from: &'static str, release: &'static str, note: &'static str) -> Move {
    Move {
        from,
        to: None,
        release,
        note,
    }
}

/// Every move, most specific first (the first match of a key wins).
pub static MOVES: &[Move] = &[
    moved(
        "custom_reward_function.path",
        "reward.custom_reward_function.path",
        "0.7.1",
    ),
    moved(
        "custom_reward_function.name",
        "reward.custom_reward_function.name",
        "0.7.1",
    ),
    moved("reward_model.enable", "reward.reward_model.enable", "0.7.1"),
    moved(
        "reward_model.enable_resource_pool",
        "reward.reward_model.enable_resource_pool",
        "0.7.1",
    ),
    moved(
        "reward_model.n_gpus_per_node",
        "reward.reward_model.n_gpus_per_node",
        "0.7.1",
    ),
    moved("reward_model.nnodes", "reward.reward_model.nnodes", "0.7.1"),
    moved(
        "reward_model.model.path",
        "reward.reward_model.model_path",
        "0.7.1",
    ),
    moved(
        "reward_model.reward_manager",
        "reward.reward_manager.name",
        "0.7.1",
    ),
    moved(
        "reward_model.reward_loop_source",
        "reward.reward_manager.source",
        "0.7.1",
    ),
    moved(
        "reward_model.reward_loop_module_path",
        "reward.reward_manager.module.path",
        "0.7.1",
    ),
    moved(
        "reward_model.reward_loop_class_name",
        "reward.reward_manager.module.name",
        "0.7.1",
    ),
    moved(
        "reward_model.sandbox_fusion.*",
        "reward.sandbox_fusion.*",
        "0.7.1",
    ),
    moved("sandbox_fusion.*", "reward.sandbox_fusion.*", "0.7.1"),
    moved(
        "reward_model.reward_kwargs.*",
        "reward.reward_kwargs.*",
        "0.7.1",
    ),
    moved("reward_model.num_workers", "reward.num_workers", "0.7.1"),
    moved("reward_manager.*", "reward.reward_manager.*", "0.7.1"),
    moved(
        "reward_model.rollout.*",
        "reward.reward_model.rollout.*",
        "0.7.1",
    ),
    dropped(
        "reward_model.*",
        "0.7.1",
        "the reward model runs as a rollout server (`reward.reward_model.rollout`); the FSDP/Megatron reward-model worker's settings have no place there",
    ),
    moved(
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        "0.7.1",
    ),
    moved(
        "actor_rollout_ref.rollout.skip_rollout",
        "skip.rollout.enable",
        "0.9.0",
    ),
    moved(
        "actor_rollout_ref.rollout.skip_dump_dir",
        "skip.rollout.dump_dir",
        "0.9.0",
    ),
    // 0.8's place of the same switch.
    moved(
        "actor_rollout_ref.rollout.skip.*",
        "skip.rollout.*",
        "0.9.0",
    ),
    moved("critic.model.fsdp_config.*", "critic.fsdp.*", "0.8.0"),
    dropped(
        "trainer.use_legacy_worker_impl",
        "0.8.0",
        "the legacy workers are gone",
    ),
    dropped(
        "algorithm.rollout_correction.rollout_rs_threshold_lower",
        "0.7.1",
        "rejection sampling takes its bounds from `rollout_rs_threshold`",
    ),
    dropped(
        "algorithm.rollout_correction.rollout_token_veto_threshold",
        "0.7.1",
        "the token veto was removed",
    ),
    dropped(
        "actor_rollout_ref.actor.megatron.grad_offload",
        "0.9.1",
        "verl's Megatron engine no longer offloads gradients by themselves",
    ),
    dropped(
        "actor_rollout_ref.ref.megatron.grad_offload",
        "0.9.1",
        "verl's Megatron engine no longer offloads gradients by themselves",
    ),
    dropped(
        "critic.megatron.grad_offload",
        "0.9.1",
        "verl's Megatron engine no longer offloads gradients by themselves",
    ),
    moved(
        "actor_rollout_ref.actor.router_replay.*",
        "actor_rollout_ref.actor.megatron.router_replay.*",
        "0.9.1",
    ),
    moved(
        "actor_rollout_ref.ref.router_replay.*",
        "actor_rollout_ref.ref.megatron.router_replay.*",
        "0.9.1",
    ),
    dropped(
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
        "0.8.0",
        "interactions were removed from the agent loop",
    ),
];

impl Move {
    /// Whether the old key on a tree of `release` is an error: verl fails at start-up where
    /// its section became a dataclass without the field; the top-level `reward_model`,
    /// `custom_reward_function` and `sandbox_fusion` stay as legacy stubs from 0.7.1, which
    /// 0.7.1 and 0.8 move over `reward` at start-up but 0.9 no longer reads (its `main_ppo`
    /// dropped that migration: the run would silently use the defaults); `trainer` is a plain
    /// mapping verl reads key by key (an unknown key is ignored: a warning).
    pub fn fatal(&self, release: (u32, u32, u32)) -> bool {
        if self.from.starts_with("trainer.") {
            return false;
        }
        let legacy_stub = [
            "reward_model.",
            "custom_reward_function.",
            "sandbox_fusion.",
        ]
        .iter()
        .any(|p| self.from.starts_with(p));
        !legacy_stub || release >= (0, 9, 0)
    }
}

/// The move that applies to `key` (a dotted path), and the key's place after it (`None`:
/// dropped).
pub fn destination(key: &str) -> Option<(&'static Move, Option<String>)> {
    MOVES.iter().find_map(|m| {
        let to = match m.from.strip_suffix(".*") {
            Some(prefix) => {
                let rest = key.strip_prefix(prefix)?.strip_prefix('.')?;
                m.to.map(|t| format!("{}.{rest}", t.trim_end_matches(".*")))
            }
            None if key == m.from => m.to.map(str::to_owned),
            None => return None,
        };
        Some((m, to))
    })
}

/// Whether `key` is, or holds, keys that moved (a section to descend into).
pub fn holds_moves(key: &str) -> bool {
    MOVES.iter().any(|m| {
        m.from
            .strip_prefix(key)
            .is_some_and(|rest| rest.starts_with('.'))
    })
}
