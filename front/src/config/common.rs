//! Small types shared by several sections: open dictionaries, "one or many" values and the
//! closed sets of names that more than one section uses (strategy, loss aggregation, KL
//! estimators, checkpoint contents).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How per-token losses are reduced to one scalar: the spec's vocabulary.
pub use verlc_spec::algo::LossAggMode;

/// How a value of one of the config's enums is spelt in verl's YAML (`"vllm"`,
/// `"separate_async"`): its serde name; empty for a value that is not a plain string.
pub fn spelling<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A dictionary that verl passes through unchecked (constructor kwargs, HF config overrides,
/// engine options). Any keys are accepted.
pub type OpenDict = serde_json::Map<String, serde_json::Value>;

/// A value that may be written either as a single item or as a list of items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// A single item.
    One(T),
    /// A list of items.
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    /// The items as a slice-like vector of references, whichever form was written.
    pub fn items(&self) -> Vec<&T> {
        match self {
            OneOrMany::One(x) => vec![x],
            OneOrMany::Many(xs) => xs.iter().collect(),
        }
    }
}

/// The parallel training backend of a role (actor, reference, critic, reward model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Strategy {
    /// PyTorch FSDP (version 1 wrapping).
    #[serde(rename = "fsdp")]
    Fsdp,
    /// PyTorch FSDP2 (`fully_shard`), which also supports CPU offload policies.
    #[serde(rename = "fsdp2")]
    Fsdp2,
    /// Megatron-core with tensor/pipeline/context/expert parallelism.
    #[serde(rename = "megatron")]
    Megatron,
}

/// The estimator of the KL divergence between the policy and the reference policy.
/// Names ending in `+` keep the value of the base estimator but take the gradient of `k2`
/// (straight-through).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum KlEstimator {
    /// Plain log-ratio (same as `k1`).
    #[serde(rename = "kl")]
    Kl,
    /// Plain log-ratio.
    #[serde(rename = "k1")]
    K1,
    /// Absolute value of the log-ratio.
    #[serde(rename = "abs")]
    Abs,
    /// Half the squared log-ratio (same as `k2`).
    #[serde(rename = "mse")]
    Mse,
    /// Half the squared log-ratio.
    #[serde(rename = "k2")]
    K2,
    /// The low-variance, always non-negative estimator (same as `k3`), clamped for stability.
    #[serde(rename = "low_var_kl")]
    LowVarKl,
    /// The low-variance, always non-negative estimator.
    #[serde(rename = "k3")]
    K3,
    /// Full-vocabulary KL; listed by verl but not implemented there.
    #[serde(rename = "full")]
    Full,
    /// `kl` value with the `k2` gradient.
    #[serde(rename = "kl+")]
    KlPlus,
    /// `k1` value with the `k2` gradient.
    #[serde(rename = "k1+")]
    K1Plus,
    /// `abs` value with the `k2` gradient.
    #[serde(rename = "abs+")]
    AbsPlus,
    /// `low_var_kl` value with the `k2` gradient.
    #[serde(rename = "low_var_kl+")]
    LowVarKlPlus,
    /// `k3` value with the `k2` gradient.
    #[serde(rename = "k3+")]
    K3Plus,
}

/// One part of a training checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum CheckpointContent {
    /// The sharded model weights.
    #[serde(rename = "model")]
    Model,
    /// The sharded optimizer state.
    #[serde(rename = "optimizer")]
    Optimizer,
    /// Scheduler state, RNG state and other bookkeeping.
    #[serde(rename = "extra")]
    Extra,
    /// A full Hugging Face copy of the weights (large; written once per checkpoint).
    #[serde(rename = "hf_model")]
    HfModel,
}

/// What a trainable role (actor or critic) saves and restores in its checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Parts written when a checkpoint is saved.
    pub save_contents: Vec<CheckpointContent>,
    /// Parts read back when resuming; by default the same list as `save_contents`.
    pub load_contents: Vec<CheckpointContent>,
    /// Write checkpoints in the background (Megatron distributed checkpoints only).
    pub async_save: bool,
}

/// Tiled MLP: computes the MLP in sequence chunks to cut activation memory on long inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TiledMlpConfig {
    /// Turn tiled MLP on (requires the `fsdp2` strategy).
    pub enabled: bool,
    /// Number of chunks the sequence is split into.
    #[schemars(range(min = 1))]
    pub num_shards: i64,
}

/// A name YAML may read as a number (`experiment_name: 20251123`, a date stamp); verl formats
/// it into paths and tracker names either way. The schema accepts both.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum NameOrNumber {
    Name(String),
    Number(serde_json::Number),
}

/// `deserialize_with` for a `String` field typed [`NameOrNumber`] in the schema.
pub fn name_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match NameOrNumber::deserialize(d)? {
        NameOrNumber::Name(s) => s,
        NameOrNumber::Number(n) => n.to_string(),
    })
}
