//! Top-level sections verl 0.9 added that verlc does not run, typed so their values are
//! checked (a wrong value is an error at its line) and the verdicts can say what a verlc
//! trainer does with them: `skip` (replaying cached rollouts). (`distillation` stays
//! unmodelled: its teacher's inference settings copy the rollout's by `${...}` in verl's own
//! files, which the verdicts would take for the user's settings.)

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `skip` (verl's `SkipManagerConfig`): per stage, whether to replay dumped data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkipConfig {
    /// Class verl instantiates this node into (Hydra metadata; not used by verlc).
    #[serde(rename = "_target_", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The rollout of the synchronous trainer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<SkipStage>,
    /// The rollout through the TransferQueue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_tq: Option<SkipStage>,
    /// The rollout of the asynchronous trainers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub async_rollout: Option<SkipStage>,
}

/// One stage of `skip`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkipStage {
    /// Replay instead of running the stage.
    pub enable: bool,
    /// Where the stage's outputs are dumped and read back.
    pub dump_dir: String,
    /// The steps to replay (empty: all).
    #[serde(default)]
    pub steps: Vec<i64>,
    /// What to replay.
    pub action: SkipAction,
}

/// `skip.*.action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SkipAction {
    /// Dump each step's output the first time, replay it afterwards.
    Cache,
    /// Replay the dumped outputs of the listed steps.
    Repeat,
}
