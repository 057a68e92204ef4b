//! verl's SFT trainer (`python -m verl.trainer.sft_trainer`, config `sft_trainer_engine`): the
//! second kind of primary config verlc checks beside the PPO trainer's.
//!
//! A composed tree is an SFT config when its top level has the SFT trainer's sections (`model`,
//! `engine`, `optim` at the top, no `actor_rollout_ref`); verl 0.7.0's legacy config
//! (`sft_trainer`, run by `fsdp_sft_trainer`) has `model.partial_pretrain` and no `engine`,
//! and is checked the same way against its own table, its values read under its own keys
//! ([`SftConfig::from_legacy_tree`]) and lowered to the legacy trainer's semantics. Its keys and their types are judged
//! against the release's SFT leaf table (`front/releases/verl-<release>.sft.json`, derived
//! from verl's own files by `scripts/release_leaves.py --sft`; [`keys`]), then verl's SFT
//! rules run on the values ([`rules`], ids `F0xx`), and `verlc explain` derives the batch
//! arithmetic ([`explain`]), and [`lower`] turns it into the SFT trainer's spec for `verlc
//! build` (with the verdicts of the keys the trainer does not read or cannot honour).

pub mod config;
pub mod explain;
pub mod keys;
pub mod lower;
mod lower_automodel;
mod lower_legacy;
mod lower_veomni;
pub mod rules;
mod section;

use crate::diag::Diagnostic;
use crate::load::node::Node;

pub use config::SftConfig;

/// verl's config of the engine-based SFT trainer (every release).
pub const CONFIG_NAME: &str = "sft_trainer_engine";
/// verl 0.7.0's legacy SFT config (`fsdp_sft_trainer`), removed in 0.7.1.
pub const LEGACY_CONFIG_NAME: &str = "sft_trainer";

/// Which trainer a composed config is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConfigKind {
    /// verl's PPO trainer (`main_ppo`): `ppo_trainer`, `ppo_megatron_trainer`.
    #[default]
    Ppo,
    /// verl's engine-based SFT trainer (`sft_trainer`): `sft_trainer_engine`.
    Sft,
    /// verl 0.7.0's legacy `fsdp_sft_trainer` (`sft_trainer.yaml`).
    LegacySft,
}

/// The kind of a composed tree, told from its top-level sections.
pub fn kind_of(root: &Node) -> ConfigKind {
    let has = |k: &str| root.child(k).is_some();
    if has("actor_rollout_ref") {
        return ConfigKind::Ppo;
    }
    if has("engine") && has("optim") && has("model") && has("data") {
        return ConfigKind::Sft;
    }
    // 0.7.0's legacy tree: `model.partial_pretrain`, the optimizer and `ulysses_*` at the top.
    if root.get_path(&["model", "partial_pretrain"]).is_some() && has("optim") {
        return ConfigKind::LegacySft;
    }
    ConfigKind::Ppo
}

/// What checking an SFT config found: its typed view (when its values have the types verl
/// reads) and the diagnostics of the keys and the rules.
pub struct SftCheck {
    pub config: Option<SftConfig>,
    pub diagnostics: Vec<Diagnostic>,
}

/// Checks a composed SFT tree of verl `release` (`0.9.1`), the engine trainer's or 0.7.0's
/// legacy one (told by [`kind_of`]): keys and types against the release's table (what `users` says the user wrote), then the rules. `world_stated`: the
/// world is known whoever wrote it (a trainer binary launches `trainer.nnodes ×
/// n_gpus_per_node` ranks), else only when the user wrote it (torchrun decides verl's).
pub fn check(
    root: &Node,
    release: &str,
    users: &dyn Fn(Option<&crate::source::Origin>) -> bool,
    world_stated: bool,
) -> SftCheck {
    let legacy = kind_of(root) == ConfigKind::LegacySft;
    let mut diagnostics = Vec::new();
    let typed_ok = keys::check(root, release, legacy, users, &mut diagnostics);
    let config = if typed_ok {
        let read = if legacy {
            SftConfig::from_legacy_tree(root)
        } else {
            SftConfig::from_tree(root)
        };
        match read {
            Ok(mut c) => {
                c.world_stated = world_stated
                    || ["nnodes", "n_gpus_per_node"].iter().any(|k| {
                        users(
                            root.get_path(&["trainer", k])
                                .and_then(|n| n.origin.as_ref()),
                        )
                    });
                Some(c)
            }
            Err(d) => {
                diagnostics.push(*d);
                None
            }
        }
    } else {
        None
    };
    if let Some(cfg) = &config {
        let ctx = rules::SftContext {
            config: cfg,
            root,
            release,
        };
        rules::run(&ctx, &mut diagnostics);
    }
    SftCheck {
        config,
        diagnostics,
    }
}
