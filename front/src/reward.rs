//! The reward settings as verl's workers read them, with the dotted key each comes from.
//!
//! verl 0.7.0 keeps them at the top level (`custom_reward_function`, `reward_manager`,
//! `reward_model`). From 0.7.1 they live in the `reward` section, and verl's start-up migration
//! (`migrate_legacy_reward_impl`) copies every top-level key that is set (not null) over its
//! `reward.*` counterpart: a whole `custom_reward_function`, `reward_model.reward_manager` as
//! the manager's name, `reward_model.reward_kwargs`, `reward_model.{enable, …}`,
//! `reward_model.model.path` as `model_path`, `reward_model.rollout.*`. [`Rewards::of`] does the
//! same, judging "set" on the composed tree (a newer tree's null stubs are not set), so the rules
//! and lowering read one view whichever layout the config uses.

use verlc_spec::Dtype;

use crate::config::{OpenDict, RewardModelConfig, RewardSource, RolloutDtype, VerlConfig};
use crate::load::node::Node;

/// The user's scoring function.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Function<'a> {
    /// The Python file; `None` scores with the built-in scorers.
    pub path: Option<&'a str>,
    pub name: &'a str,
    pub kwargs: Option<&'a OpenDict>,
    /// `custom_reward_function` or `reward.custom_reward_function`.
    pub prefix: &'static str,
}

/// The reward manager.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Manager<'a> {
    /// `reward_manager` or `reward.reward_manager`.
    pub prefix: &'static str,
    pub source: RewardSource,
    pub module_path: Option<&'a str>,
    /// The manager's name (`naive`, `dapo`, …) and the key that set it.
    pub name: &'a str,
    pub name_key: &'static str,
    /// The manager's keyword arguments and where they live.
    pub kwargs: Option<&'a OpenDict>,
    pub kwargs_key: &'static str,
}

/// The reward model.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Model<'a> {
    /// verl 0.7.0's `reward_model` section: a worker of its own (FSDP/Megatron) or, with
    /// `use_reward_loop`, the reward loop.
    Legacy(&'a RewardModelConfig),
    /// The reward loop's model (`reward.reward_model`, with migrated top-level keys).
    Loop(LoopModel<'a>),
}

/// `reward.reward_model` after the migration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoopModel<'a> {
    pub enable: bool,
    pub enable_key: &'static str,
    pub resource_pool: bool,
    pub resource_pool_key: &'static str,
    pub n_gpus_per_node: (i64, &'static str),
    pub nnodes: (i64, &'static str),
    pub path: Option<&'a str>,
    pub path_key: &'static str,
    /// The server's weight dtype (`rollout.dtype`; `None`: the checkpoint's).
    pub dtype: Option<Dtype>,
}

impl Model<'_> {
    pub(crate) fn enabled(&self) -> bool {
        match self {
            Model::Legacy(rm) => rm.enable,
            Model::Loop(m) => m.enable,
        }
    }

    pub(crate) fn enable_key(&self) -> &'static str {
        match self {
            Model::Legacy(_) => "reward_model.enable",
            Model::Loop(m) => m.enable_key,
        }
    }

    /// Whether the reward model has a resource pool of its own, and the key.
    pub(crate) fn resource_pool(&self) -> (bool, &'static str) {
        match self {
            Model::Legacy(rm) => (rm.enable_resource_pool, "reward_model.enable_resource_pool"),
            Model::Loop(m) => (m.resource_pool, m.resource_pool_key),
        }
    }
}

/// Every reward setting, from the layout the config uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rewards<'a> {
    pub function: Function<'a>,
    pub manager: Manager<'a>,
    pub model: Model<'a>,
}

impl<'a> Rewards<'a> {
    /// Whether the reward model's scores are the training scores: it is on, and no custom
    /// function takes over (the reward loop then scores with the function alone).
    pub(crate) fn model_scores(&self) -> bool {
        let reward_loop = match self.model {
            Model::Legacy(rm) => rm.use_reward_loop,
            Model::Loop(_) => true,
        };
        self.model.enabled() && !(reward_loop && self.function.path.is_some())
    }

    /// The settings of `cfg`, whose composed tree is `root` (for what is set).
    pub(crate) fn of(cfg: &'a VerlConfig, root: &Node) -> Self {
        let Some(r) = &cfg.reward else {
            return Rewards {
                function: legacy_function(cfg),
                manager: Manager {
                    prefix: "reward_manager",
                    source: cfg.reward_manager.source,
                    module_path: cfg.reward_manager.module.path.as_deref(),
                    name: &cfg.reward_manager.name,
                    // `reward_manager.name` defaults to the deprecated key: blame the one that
                    // holds the name.
                    name_key: if cfg.reward_model.reward_manager.as_deref()
                        == Some(cfg.reward_manager.name.as_str())
                    {
                        "reward_model.reward_manager"
                    } else {
                        "reward_manager.name"
                    },
                    kwargs: cfg.reward_model.reward_kwargs.as_ref(),
                    kwargs_key: "reward_model.reward_kwargs",
                },
                model: Model::Legacy(&cfg.reward_model),
            };
        };
        let set = |key: &str| is_set(root, key);
        let legacy = &cfg.reward_model;
        let function = if ["path", "name", "reward_kwargs"]
            .iter()
            .any(|k| set(&format!("custom_reward_function.{k}")))
        {
            legacy_function(cfg)
        } else {
            let f = &r.custom_reward_function;
            Function {
                path: f.path.as_deref().filter(|p| !p.is_empty()),
                name: &f.name,
                kwargs: f.reward_kwargs.as_ref(),
                prefix: "reward.custom_reward_function",
            }
        };
        let (name, name_key) = match legacy.reward_manager.as_deref() {
            Some(n) if set("reward_model.reward_manager") => (n, "reward_model.reward_manager"),
            _ => (r.reward_manager.name.as_str(), "reward.reward_manager.name"),
        };
        let (kwargs, kwargs_key) = migrated(
            root,
            ("reward_model.reward_kwargs", legacy.reward_kwargs.as_ref()),
            ("reward.reward_kwargs", r.reward_kwargs.as_ref()),
        );
        let m = &r.reward_model;
        let (enable, enable_key) = migrated(
            root,
            ("reward_model.enable", legacy.enable),
            ("reward.reward_model.enable", m.enable),
        );
        let (resource_pool, resource_pool_key) = migrated(
            root,
            (
                "reward_model.enable_resource_pool",
                legacy.enable_resource_pool,
            ),
            (
                "reward.reward_model.enable_resource_pool",
                m.enable_resource_pool,
            ),
        );
        let (path, path_key) = migrated(
            root,
            ("reward_model.model.path", Some(legacy.model.path.as_str())),
            ("reward.reward_model.model_path", m.model_path.as_deref()),
        );
        let dtype = if set("reward_model.rollout.dtype") {
            legacy.rollout.dtype.dtype()
        } else {
            match m.rollout.get("dtype").and_then(serde_json::Value::as_str) {
                Some(s) => serde_json::from_value::<RolloutDtype>(s.into())
                    .ok()
                    .and_then(RolloutDtype::dtype),
                None => Some(Dtype::Bf16),
            }
        };
        Rewards {
            function,
            manager: Manager {
                prefix: "reward.reward_manager",
                source: r.reward_manager.source,
                module_path: r.reward_manager.module.path.as_deref(),
                name,
                name_key,
                kwargs,
                kwargs_key,
            },
            model: Model::Loop(LoopModel {
                enable,
                enable_key,
                resource_pool,
                resource_pool_key,
                n_gpus_per_node: migrated(
                    root,
                    ("reward_model.n_gpus_per_node", legacy.n_gpus_per_node),
                    ("reward.reward_model.n_gpus_per_node", m.n_gpus_per_node),
                ),
                nnodes: migrated(
                    root,
                    ("reward_model.nnodes", legacy.nnodes),
                    ("reward.reward_model.nnodes", m.nnodes),
                ),
                path,
                path_key,
                dtype,
            }),
        }
    }
}

fn legacy_function(cfg: &VerlConfig) -> Function<'_> {
    let f = &cfg.custom_reward_function;
    Function {
        path: f.path.as_deref().filter(|p| !p.is_empty()),
        name: &f.name,
        kwargs: f.reward_kwargs.as_ref(),
        prefix: "custom_reward_function",
    }
}

/// The top-level key's value when it is set, else the section's (verl's migration), with the
/// key it came from.
fn migrated<T>(
    root: &Node,
    (legacy_key, old): (&'static str, T),
    (new_key, new): (&'static str, T),
) -> (T, &'static str) {
    if is_set(root, legacy_key) {
        (old, legacy_key)
    } else {
        (new, new_key)
    }
}

/// Whether `key` holds a value other than null in the composed tree (verl's "is not None").
fn is_set(root: &Node, key: &str) -> bool {
    root.get_path(&crate::load::node::split_key(key))
        .is_some_and(|n| !n.is_null())
}
