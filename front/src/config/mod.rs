//! The typed verl config model: serde + schemars types for every key of the composed
//! config, with verl's spellings.
//!
//! The root is [`VerlConfig`]. It deserializes a fully composed and interpolated tree (what
//! the loader produces from the user's files, the built-in defaults and the overrides); it
//! never fills in defaults itself. The JSON Schema generated from these types (doc comments
//! become descriptions) is what `verlc check` validates against and what editors complete.
//!
//! Layout, one concern per module:
//! - `common`: open dicts, one-or-many values, and enums shared by several sections
//!   ([`Strategy`], [`LossAggMode`], [`KlEstimator`], checkpoint contents).
//! - `optim`: [`OptimConfig`], the optimizer group (union of the FSDP and Megatron keys).
//! - `engine`: [`FsdpEngineConfig`] (`fsdp_config`) and [`MegatronEngineConfig`] (`megatron`).
//! - `actor`, `reference`, `rollout`, `model`: the four parts of `actor_rollout_ref`
//!   ([`ActorConfig`], [`RefConfig`], [`RolloutConfig`], [`HfModelConfig`]); `agent` holds
//!   the rollout's multi-turn, agent-loop and trace nodes.
//! - `critic`: [`CriticConfig`].
//! - `reward`, `reward_engine`: `reward_model`, `reward_manager`, `custom_reward_function`.
//! - `data`, `algorithm`, `trainer` (also `ray_kwargs`, `transfer_queue`), `profiler`
//!   (per-role `profiler` nodes and `global_profiler`).
//! - `deprecated`: [`DEPRECATED_KEYS`], renamed or deprecated keys for the warning rule.
//! - `builtin`: [`BUILTIN_FILES`], verlc's own default tree (`front/defaults/`).
//!
//! Conventions:
//! - One root type covers both trainer flavours (`ppo_trainer.yaml`, FSDP, and
//!   `ppo_megatron_trainer.yaml`, Megatron). Keys that exist in one flavour only are `Option`
//!   fields with `#[serde(default)]`, documented "FSDP only" / "Megatron only" and tagged
//!   `x-verlc-flavour` in the schema.
//! - Every struct denies unknown fields. Dictionaries verl passes through unchecked are
//!   [`OpenDict`].
//! - A nullable key is an `Option`. An absent `Option` key reads as null (serde and the
//!   schema both accept it). `#[serde(default)]` marks keys that are legitimately absent
//!   from verl's YAML: flavour-only keys, deprecated keys, and keys verl reads with `.get()`
//!   that users add with `+key=`.
//! - Deprecated keys carry `"deprecated": true` in the schema and a "Deprecated: use X" doc.
//! - `_target_` keys (Hydra metadata naming verl's Python class) are accepted and ignored.

pub mod actor;
pub mod agent;
pub mod algorithm;
pub mod builtin;
pub mod common;
pub mod critic;
pub mod data;
pub mod deprecated;
pub mod engine;
pub mod model;
pub mod optim;
pub mod profiler;
pub mod reference;
pub mod release_0_9;
pub mod reward;
pub mod reward_engine;
pub mod rollout;
pub mod trainer;

#[cfg(test)]
mod tests;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use actor::*;
pub use agent::*;
pub use algorithm::*;
pub use builtin::*;
pub use common::*;
pub use critic::*;
pub use data::*;
pub use deprecated::*;
pub use engine::*;
pub use model::*;
pub use optim::*;
pub use profiler::*;
pub use reference::*;
pub use release_0_9::*;
pub use reward::*;
pub use reward_engine::*;
pub use rollout::*;
pub use trainer::*;

/// A complete, composed verl PPO configuration (either trainer flavour).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerlConfig {
    /// The policy side: actor, rollout engine, reference policy and their shared model.
    pub actor_rollout_ref: ActorRolloutRefConfig,
    /// The prompt dataset.
    pub data: DataConfig,
    /// The reward manager.
    pub reward_manager: RewardManagerConfig,
    /// The value model.
    pub critic: CriticConfig,
    /// The optional reward model and reward loop.
    pub reward_model: RewardModelConfig,
    /// The RL algorithm.
    pub algorithm: AlgorithmConfig,
    /// A user scoring function.
    pub custom_reward_function: CustomRewardFunctionConfig,
    /// verl 0.7.1+'s home of the reward settings (function, manager, reward model); the
    /// top-level `custom_reward_function` / `reward_model` / `reward_manager` migrate into it
    /// when set. Absent from 0.7.0 trees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<RewardSection>,
    /// The training run.
    pub trainer: TrainerConfig,
    /// Run-wide profiling.
    pub global_profiler: GlobalProfilerConfig,
    /// The experimental TransferQueue data plane.
    pub transfer_queue: TransferQueueConfig,
    /// Ray launch settings.
    pub ray_kwargs: RayKwargs,
    /// verl 0.9+: replaying cached rollouts instead of generating (replaces
    /// `rollout.skip_rollout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip: Option<SkipConfig>,
    /// verl 0.8+: the engine group (`model_engine=megatron`) as the composed tree records it
    /// (the choice itself selects the engine files at composition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_engine: Option<String>,
}

/// The policy side of the run. Actor, rollout and reference policy run colocated on the same
/// accelerators (the hybrid engine) and share one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActorRolloutRefConfig {
    /// The policy being trained.
    pub actor: ActorConfig,
    /// The frozen reference policy.
    #[serde(rename = "ref")]
    pub reference: RefConfig,
    /// Response generation.
    pub rollout: RolloutConfig,
    /// The shared Hugging Face model.
    pub model: HfModelConfig,
    /// Colocate actor, rollout and reference policy; verl supports only `true`.
    pub hybrid_engine: bool,
    /// Timeout of collective operations, in seconds.
    #[schemars(range(min = 1))]
    pub nccl_timeout: i64,
}

/// The two trainer flavours, named after verl's entry configs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavour {
    /// `ppo_trainer.yaml`: FSDP engines.
    Fsdp,
    /// `ppo_megatron_trainer.yaml`: Megatron engines.
    Megatron,
}

impl Flavour {
    /// The entry file of this flavour in the default tree.
    pub fn entry_file(self) -> &'static str {
        match self {
            Flavour::Fsdp => "ppo_trainer.yaml",
            Flavour::Megatron => "ppo_megatron_trainer.yaml",
        }
    }
}

impl VerlConfig {
    /// The flavour this config was composed from, judged by the actor's strategy.
    pub fn flavour(&self) -> Flavour {
        match self.actor_rollout_ref.actor.strategy {
            Strategy::Megatron => Flavour::Megatron,
            Strategy::Fsdp | Strategy::Fsdp2 => Flavour::Fsdp,
        }
    }
}

/// A group whose files can be checked on their own, with its type's root schema.
#[derive(Debug, Clone, Copy)]
pub struct GroupType {
    /// Group name as in the defaults tree (`optim/fsdp`, `actor`, …).
    pub group: &'static str,
    /// Builds the root schema of the group's type with the given settings.
    pub root_schema: fn(schemars::generate::SchemaSettings) -> schemars::Schema,
}

fn root_schema_of<T: JsonSchema>(settings: schemars::generate::SchemaSettings) -> schemars::Schema {
    settings.into_generator().into_root_schema_for::<T>()
}

/// The config groups with their types, for per-group schemas. Both optimizer groups use
/// [`OptimConfig`].
pub fn group_types() -> &'static [GroupType] {
    const GROUPS: &[GroupType] = &[
        GroupType {
            group: "optim/fsdp",
            root_schema: root_schema_of::<OptimConfig>,
        },
        GroupType {
            group: "optim/megatron",
            root_schema: root_schema_of::<OptimConfig>,
        },
        GroupType {
            group: "engine/fsdp",
            root_schema: root_schema_of::<FsdpEngineConfig>,
        },
        GroupType {
            group: "engine/megatron",
            root_schema: root_schema_of::<MegatronEngineConfig>,
        },
        GroupType {
            group: "actor",
            root_schema: root_schema_of::<ActorConfig>,
        },
        GroupType {
            group: "ref",
            root_schema: root_schema_of::<RefConfig>,
        },
        GroupType {
            group: "critic",
            root_schema: root_schema_of::<CriticConfig>,
        },
        GroupType {
            group: "rollout",
            root_schema: root_schema_of::<RolloutConfig>,
        },
        GroupType {
            group: "model",
            root_schema: root_schema_of::<HfModelConfig>,
        },
        GroupType {
            group: "data",
            root_schema: root_schema_of::<DataConfig>,
        },
        GroupType {
            group: "algorithm",
            root_schema: root_schema_of::<AlgorithmConfig>,
        },
        GroupType {
            group: "trainer",
            root_schema: root_schema_of::<TrainerConfig>,
        },
    ];
    GROUPS
}
