//! The rollout's weights at another tensor parallel size than training's (verl's
//! `rollout.tensor_model_parallel_size`): the groups of that layout
//! ([`crate::parallel::layout::RankLayout::rollout_groups`]) and each rank's rollout shards, cut from the
//! training shards one tensor at a time, so no rank ever holds more than one full tensor.
//!
//! - Rollout TP smaller (`k = t / r`): a rollout shard is `k` consecutive training shards,
//!   all-gathered over those `k` ranks (the peers).
//! - Rollout TP larger (`m = r / t`): a rollout shard is a slice of the rank's own training
//!   shard (no communication).
//! - The embedding and output layer are split by padded vocabulary rows, and the padding
//!   depends on the group size: they are gathered whole over the training TP group and cut
//!   again.
//! - Replicated tensors (norms) are the rank's own.
use tch::Tensor;

use crate::engine::hybrid::ReplicaShare;
use crate::model::ModelConfig;
use crate::model::tensor_parallel::{ShardSpec, shard_spec};
use crate::parallel::dist::ProcessGroup;
use crate::parallel::layout::{ProcessGroups, RolloutGroups};
use crate::parallel::mappings::all_gather_dim;
use crate::parallel::tp::shard::{gather_tensor, shard_tensor};

use super::{MegatronError, ParamInfo, Result};

/// This rank's place in a rollout laid out at another TP size; see the module docs.
#[derive(Debug, Clone)]
pub struct RolloutShards {
    /// The rollout's TP group (size `r`).
    pub tp: ProcessGroup,
    /// How the replicas share the prompts; its peers are also the ranks this one cuts its
    /// weight shards with.
    pub share: ReplicaShare,
}

fn missing(what: &str) -> MegatronError {
    MegatronError::Config(format!("this rank is in no rollout {what} group"))
}

impl RolloutShards {
    /// The groups for rollout TP `r` (≠ training TP) over the training `groups` (collective
    /// over the world).
    pub fn new(groups: &ProcessGroups, r: usize) -> Result<Self> {
        let RolloutGroups { tp, peers, join } = groups.layout.rollout_groups(r)?;
        let tp = groups
            .world
            .split(&tp)?
            .ok_or_else(|| missing("tensor parallel"))?;
        let peers = groups.world.split(&peers)?.ok_or_else(|| missing("peer"))?;
        let share = if join {
            ReplicaShare::Join { peers }
        } else {
            ReplicaShare::Split { peers }
        };
        Ok(RolloutShards { tp, share })
    }

    /// This rank's rollout shard of every parameter in `params` (the rank's training shards
    /// over `train_tp`), by name. `copy`: the result must not share storage with the training
    /// tensors (they are parked while the rollout generates).
    pub fn reshard(
        &self,
        params: Vec<ParamInfo>,
        train_tp: Option<&ProcessGroup>,
        cfg: &ModelConfig,
        copy: bool,
    ) -> Result<Vec<(String, Tensor)>> {
        let vocab = cfg.vocab_size;
        let (rank, size) = (self.tp.rank() as i64, self.tp.size() as i64);
        params
            .into_iter()
            .map(|p| {
                let local = p.tensor.detach();
                let shard = match shard_spec(cfg, &p.name) {
                    ShardSpec::Replicated => local,
                    ShardSpec::Vocab => {
                        let full = gather_tensor(&local, ShardSpec::Vocab, train_tp, vocab)?;
                        shard_tensor(&full, ShardSpec::Vocab, rank, size)
                            .map_err(MegatronError::Config)?
                            .f_contiguous()?
                    }
                    // Section by section, as a dim-0 split each: the peers' parts of every
                    // section joined, or this rank's part of every section cut.
                    ShardSpec::Sections(sizes) => {
                        let train = train_tp.map_or(1, ProcessGroup::size) as i64;
                        let mut parts = Vec::with_capacity(sizes.len());
                        let mut start = 0;
                        for n in sizes {
                            let mine = local.f_narrow(0, start, n / train)?;
                            start += n / train;
                            parts.push(match &self.share {
                                ReplicaShare::Split { peers } => all_gather_dim(&mine, peers, 0)?,
                                ReplicaShare::Join { peers } => {
                                    let (m, c) = (peers.size() as i64, peers.rank() as i64);
                                    let len = n / train;
                                    if len % m != 0 {
                                        return Err(MegatronError::Config(format!(
                                            "`{}`: a section of {len} channels cannot be split {m} ways for the rollout",
                                            p.name
                                        )));
                                    }
                                    mine.f_narrow(0, c * (len / m), len / m)?
                                }
                            });
                        }
                        Tensor::f_cat(&parts, 0)?
                    }
                    ShardSpec::Dim(d) => match &self.share {
                        ReplicaShare::Split { peers } => all_gather_dim(&local, peers, d)?,
                        ReplicaShare::Join { peers } => {
                        let (m, c) = (peers.size() as i64, peers.rank() as i64);
                        let len = local.size()[d as usize];
                        if len % m != 0 {
                            return Err(MegatronError::Config(format!(
                                "`{}`: dim {d} of its training shard ({len}) cannot be split {m} ways for the rollout",
                                p.name
                            )));
                        }
                        local.f_narrow(d, c * (len / m), len / m)?
                        }
                    },
                };
                // Some shards are views of the training tensors (replicated ones, slices);
                // with those parked while the rollout generates, the rollout needs its own.
                let shard = if copy { shard.f_detach_copy()? } else { shard };
                Ok((p.name, shard))
            })
            .collect()
    }
}

/// `named` with every routed expert, held whole (expert tensor parallel 1), cut to part `rank`
/// of `tp` as a model whose experts are split like dense MLPs (the rollout's) holds it; the
/// other tensors unchanged. `copy`: the cut parts do not share storage with `named`.
pub fn cut_whole_experts(
    named: Vec<(String, Tensor)>,
    cfg: &ModelConfig,
    tp: &ProcessGroup,
    copy: bool,
) -> Result<Vec<(String, Tensor)>> {
    let (rank, size) = (tp.rank() as i64, tp.size() as i64);
    named
        .into_iter()
        .map(|(name, t)| {
            if !crate::model::tensor_parallel::is_routed_expert_param(&name) {
                return Ok((name, t));
            }
            let part = shard_tensor(&t.detach(), shard_spec(cfg, &name), rank, size)
                .map_err(MegatronError::Config)?
                .f_contiguous()?;
            let part = if copy { part.f_detach_copy()? } else { part };
            Ok((name, part))
        })
        .collect()
}
