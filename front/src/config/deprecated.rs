//! The table of deprecated and renamed keys that verl still accepts, for the warning rule.
//!
//! Path patterns are dotted key paths from the root of the composed config. A segment `*`
//! matches exactly one key of any name (e.g. `actor_rollout_ref.*.log_prob_micro_batch_size`
//! matches both the `ref` and the `rollout` keys). In `replacement`, a `*` stands for the key
//! that the `*` at the same position of `path` matched.
//!
//! Most of these keys exist in the default tree with a null (or neutral) value, so the rule
//! should only fire for keys the user wrote, not for keys that come from the defaults.

/// A deprecated or renamed key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeprecatedKey {
    /// Dotted path pattern of the old key.
    pub path: &'static str,
    /// Dotted path pattern of the key to use instead; `None` when the key should simply be
    /// removed.
    pub replacement: Option<&'static str>,
    /// One-line explanation shown with the warning.
    pub note: &'static str,
}

impl DeprecatedKey {
    /// Whether `path` (a concrete dotted path) matches this entry's pattern.
    pub fn matches(&self, path: &str) -> bool {
        let pattern: Vec<&str> = self.path.split('.').collect();
        let concrete: Vec<&str> = path.split('.').collect();
        pattern.len() == concrete.len()
            && pattern
                .iter()
                .zip(&concrete)
                .all(|(p, c)| *p == "*" || p == c)
    }

    /// The concrete replacement path for a matching concrete `path`, with each `*` filled in
    /// from `path`. `None` when the entry has no replacement or `path` does not match.
    pub fn replacement_for(&self, path: &str) -> Option<String> {
        let replacement = self.replacement?;
        if !self.matches(path) {
            return None;
        }
        let pattern: Vec<&str> = self.path.split('.').collect();
        let concrete: Vec<&str> = path.split('.').collect();
        let filled: Vec<&str> = replacement
            .split('.')
            .enumerate()
            .map(|(i, seg)| match (seg, pattern.get(i)) {
                ("*", Some(&"*")) => concrete[i],
                _ => seg,
            })
            .collect();
        Some(filled.join("."))
    }
}

/// Every deprecated or renamed key verlc knows about.
pub static DEPRECATED_KEYS: &[DeprecatedKey] = &[
    DeprecatedKey {
        path: "actor_rollout_ref.actor.ppo_micro_batch_size",
        replacement: Some("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
        note: "the global micro-batch size is divided by the data-parallel size; give the per-rank size instead (setting both is an error)",
    },
    DeprecatedKey {
        path: "actor_rollout_ref.*.log_prob_micro_batch_size",
        replacement: Some("actor_rollout_ref.*.log_prob_micro_batch_size_per_gpu"),
        note: "give the per-rank log-prob micro-batch size instead (setting both is an error)",
    },
    DeprecatedKey {
        path: "critic.ppo_micro_batch_size",
        replacement: Some("critic.ppo_micro_batch_size_per_gpu"),
        note: "give the per-rank micro-batch size instead (setting both is an error)",
    },
    DeprecatedKey {
        path: "critic.forward_micro_batch_size",
        replacement: Some("critic.forward_micro_batch_size_per_gpu"),
        note: "give the per-rank forward micro-batch size instead",
    },
    DeprecatedKey {
        path: "reward_model.micro_batch_size",
        replacement: Some("reward_model.micro_batch_size_per_gpu"),
        note: "give the per-rank micro-batch size instead (setting both is an error)",
    },
    DeprecatedKey {
        path: "actor_rollout_ref.actor.optim.warmup_style",
        replacement: Some("actor_rollout_ref.actor.optim.lr_scheduler_type"),
        note: "renamed; when set it overrides lr_scheduler_type",
    },
    DeprecatedKey {
        path: "critic.optim.warmup_style",
        replacement: Some("critic.optim.lr_scheduler_type"),
        note: "renamed; when set it overrides lr_scheduler_type",
    },
    DeprecatedKey {
        path: "actor_rollout_ref.actor.optim.grad_clip",
        replacement: Some("actor_rollout_ref.actor.optim.clip_grad"),
        note: "renamed; when set it overrides clip_grad",
    },
    DeprecatedKey {
        path: "critic.optim.grad_clip",
        replacement: Some("critic.optim.clip_grad"),
        note: "renamed; when set it overrides clip_grad",
    },
    DeprecatedKey {
        path: "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        replacement: Some("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"),
        note: "sequence parallelism is an engine setting; a value above 1 is copied there",
    },
    DeprecatedKey {
        path: "critic.ulysses_sequence_parallel_size",
        replacement: Some("critic.model.fsdp_config.ulysses_sequence_parallel_size"),
        note: "sequence parallelism is an engine setting",
    },
    DeprecatedKey {
        path: "actor_rollout_ref.rollout.mode",
        replacement: None,
        note: "only `async` is supported and the key is going away; `sync` is an error",
    },
    DeprecatedKey {
        path: "reward_model.reward_manager",
        replacement: Some("reward_manager.name"),
        note: "the reward manager has its own node now",
    },
    DeprecatedKey {
        path: "data.val_batch_size",
        replacement: None,
        note: "ignored: the whole validation set is sent to the rollout engine as one batch",
    },
    DeprecatedKey {
        path: "trainer.remove_previous_ckpt_in_save",
        replacement: Some("trainer.max_actor_ckpt_to_keep"),
        note: "set max_actor_ckpt_to_keep and max_critic_ckpt_to_keep to 1 instead",
    },
];
