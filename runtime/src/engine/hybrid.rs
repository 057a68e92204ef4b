//! What an engine tells the rollout about its weights in verl's hybrid engine (the model
//! generates between training steps): the whole model, or a Megatron rank's shards of it and
//! how the rollout replicas share out the prompts. The rollout (`crate::rollout`) builds its
//! decoder and reshards from these.

use crate::model::ModelConfig;
use crate::parallel::dist::ProcessGroup;

/// What the hybrid engine's rollout model looks like on this rank: the whole model, or the
/// rank's shards of it (what [`super::Engine::rollout_layout`] reports).
#[derive(Debug, Clone)]
pub enum RolloutLayout {
    Full(ModelConfig),
    Sharded(ShardLayout),
}

/// One Megatron rank's part of the rollout model: its pipeline stage's layers and its
/// tensor-parallel slice of the rollout's TP group (training's, or another size: then `share`
/// says how the replicas split the data-parallel ranks' prompts).
#[derive(Debug, Clone)]
pub struct ShardLayout {
    pub config: ModelConfig,
    pub stage: super::megatron::Stage,
    /// The rollout's tensor-parallel group (`None`: one rank).
    pub tp: Option<ProcessGroup>,
    pub pp: Option<ProcessGroup>,
    /// `None` when a rollout replica is one data-parallel rank's model (rollout TP = training
    /// TP).
    pub share: Option<ReplicaShare>,
}

impl RolloutLayout {
    pub fn config(&self) -> &ModelConfig {
        match self {
            RolloutLayout::Full(c) => c,
            RolloutLayout::Sharded(s) => &s.config,
        }
    }
}

/// How this rank's rollout replica shares prompts with the others; see `crate::rollout::replicas`.
#[derive(Debug, Clone)]
pub enum ReplicaShare {
    /// This rank's rollout-TP peers in the other replicas of its training TP group, in
    /// replica order (this replica's index is the rank in it).
    Split { peers: ProcessGroup },
    /// The ranks of this replica with this rank's training TP rank, one per data-parallel
    /// rank, in data-parallel order.
    Join { peers: ProcessGroup },
}
