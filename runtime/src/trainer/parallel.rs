//! The trainer over several ranks: which engines each role gets ([`Roles`], one
//! implementation per strategy) and how a step's data is split over the data-parallel
//! ranks ([`DataParallel`]).
//!
//! Every rank runs the same loop (SPMD). The prompts of a step are split into contiguous
//! chunks, one per data-parallel rank (verl's `chunk` dispatch; every sample of a prompt stays
//! on its rank). Each rank generates, scores and runs the forward passes (old log-probs,
//! reference, values) for its chunk; the rows are then all-gathered so that the KL penalty,
//! the advantages (some estimators normalise over the whole batch) and the metrics are
//! computed on the full batch, identically on every rank, exactly as one process computes
//! them. The updates take the rank's own rows again; the engines average gradients over the
//! data-parallel group. Ranks of one data-parallel replica (tensor/pipeline peers) hold the
//! same chunk.

use tch::Tensor;
use verlc_spec::trainer::EngineSpec;

use crate::engine::fsdp::{FsdpEngine, FsdpSettings};
use crate::engine::megatron::{MegatronEngine, MegatronSettings};
use crate::engine::{Batch, Engine, EngineSettings, Metrics, SingleEngine};
use crate::model::{CausalLm, ValueModel};
use crate::parallel::dist::{ProcessGroup, ReduceOp};

use super::TrainerError;

fn bad(msg: impl Into<String>) -> TrainerError {
    TrainerError::Config(msg.into())
}

fn dist(e: crate::parallel::dist::DistError) -> TrainerError {
    TrainerError::Engine(crate::engine::EngineError::Config(e.to_string()))
}

/// Which engine each role runs on: the strategy binding of a trainer.
pub trait Roles {
    type Actor: Engine<Head = CausalLm>;
    type Critic: Engine<Head = ValueModel>;

    /// The trainable policy on its engine (`engine` is its spec).
    fn actor(
        &self,
        engine: &EngineSpec,
        settings: EngineSettings,
    ) -> Result<Self::Actor, TrainerError>;
    /// The frozen reference policy (`settings.optim` is `None`) on the actor's engine type.
    fn reference(
        &self,
        engine: &EngineSpec,
        settings: EngineSettings,
    ) -> Result<Self::Actor, TrainerError> {
        self.actor(engine, settings)
    }
    /// The value model.
    fn critic(
        &self,
        engine: &EngineSpec,
        settings: EngineSettings,
    ) -> Result<Self::Critic, TrainerError>;
    /// The group the actor's batches are split over (`None`: one data-parallel rank).
    fn data_group(&self, actor: &Self::Actor) -> Option<ProcessGroup>;
    /// All ranks of the run (`None`: one process).
    fn world(&self) -> Option<&ProcessGroup>;
}

/// One process, the single engine.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleRoles;

impl Roles for SingleRoles {
    type Actor = SingleEngine<CausalLm>;
    type Critic = SingleEngine<ValueModel>;

    fn actor(&self, _: &EngineSpec, s: EngineSettings) -> Result<Self::Actor, TrainerError> {
        Ok(SingleEngine::new(s)?)
    }
    fn critic(&self, _: &EngineSpec, s: EngineSettings) -> Result<Self::Critic, TrainerError> {
        Ok(SingleEngine::new(s)?)
    }
    fn data_group(&self, _: &Self::Actor) -> Option<ProcessGroup> {
        None
    }
    fn world(&self) -> Option<&ProcessGroup> {
        None
    }
}

/// FSDP (ZeRO-3) over all ranks, each role with its own `fsdp_config` (offload,
/// `reshard_after_forward`, `reduce_dtype`, `fsdp_size` for HYBRID_SHARD).
#[derive(Debug, Clone)]
pub struct FsdpRoles {
    pub world: ProcessGroup,
}

impl FsdpRoles {
    fn build<H: crate::engine::fsdp::FsdpHead>(
        &self,
        s: EngineSettings,
        engine: &EngineSpec,
    ) -> Result<FsdpEngine<H>, TrainerError> {
        let EngineSpec::Fsdp(f) = engine else {
            return Err(bad("an FSDP trainer was given a Megatron engine spec"));
        };
        let (settings, fsdp_size) = FsdpSettings::from_spec(s, f);
        Ok(FsdpEngine::with_mesh(
            settings,
            self.world.clone(),
            fsdp_size,
        )?)
    }
}

impl Roles for FsdpRoles {
    type Actor = FsdpEngine<CausalLm>;
    type Critic = FsdpEngine<ValueModel>;

    fn actor(&self, e: &EngineSpec, s: EngineSettings) -> Result<Self::Actor, TrainerError> {
        self.build(s, e)
    }
    fn critic(&self, e: &EngineSpec, s: EngineSettings) -> Result<Self::Critic, TrainerError> {
        self.build(s, e)
    }
    fn data_group(&self, actor: &Self::Actor) -> Option<ProcessGroup> {
        Some(actor.data_group().clone())
    }
    fn world(&self) -> Option<&ProcessGroup> {
        Some(&self.world)
    }
}

/// Megatron (TP × PP × DP, distributed optimizer, Megatron's parameter groups), each role
/// with its own `megatron` section; every role must have the actor's data-parallel size.
/// `world: None` runs the Megatron engine in one process.
#[derive(Debug, Clone)]
pub struct MegatronRoles {
    pub world: Option<ProcessGroup>,
}

impl MegatronRoles {
    fn build<H: crate::engine::megatron::MegatronHead>(
        &self,
        s: EngineSettings,
        engine: &EngineSpec,
    ) -> Result<MegatronEngine<H>, TrainerError> {
        let EngineSpec::Megatron(m) = engine else {
            return Err(bad("a Megatron trainer was given an FSDP engine spec"));
        };
        let m = MegatronSettings::from_spec(self.world.as_ref(), m)?;
        Ok(MegatronEngine::new(s, m)?)
    }
}

impl Roles for MegatronRoles {
    type Actor = MegatronEngine<CausalLm>;
    type Critic = MegatronEngine<ValueModel>;

    fn actor(&self, e: &EngineSpec, s: EngineSettings) -> Result<Self::Actor, TrainerError> {
        self.build(s, e)
    }
    fn critic(&self, e: &EngineSpec, s: EngineSettings) -> Result<Self::Critic, TrainerError> {
        self.build(s, e)
    }
    fn data_group(&self, actor: &Self::Actor) -> Option<ProcessGroup> {
        actor.megatron_module().groups().map(|g| g.dp.clone())
    }
    fn world(&self) -> Option<&ProcessGroup> {
        self.world.as_ref()
    }
}

/// This rank's place in the data split, and the collectives the trainer needs.
#[derive(Debug, Clone, Default)]
pub struct DataParallel {
    /// The data-parallel group (`None`: one rank).
    pub group: Option<ProcessGroup>,
    /// All ranks (barriers around checkpoints).
    pub world: Option<ProcessGroup>,
}

impl DataParallel {
    pub fn rank(&self) -> usize {
        self.group.as_ref().map_or(0, ProcessGroup::rank)
    }

    pub fn size(&self) -> usize {
        self.group.as_ref().map_or(1, ProcessGroup::size)
    }

    pub fn world_size(&self) -> usize {
        self.world.as_ref().map_or(1, ProcessGroup::size)
    }

    /// Global rank 0: the rank that logs and writes the shared checkpoint files.
    pub fn is_main(&self) -> bool {
        self.world.as_ref().is_none_or(|w| w.rank() == 0)
    }

    /// This rank's contiguous chunk `[start, end)` of `n` items.
    pub fn chunk(&self, n: usize) -> Result<std::ops::Range<usize>, TrainerError> {
        let (size, rank) = (self.size(), self.rank());
        if !n.is_multiple_of(size) {
            return Err(bad(format!(
                "a batch of {n} prompts cannot be split evenly over {size} data-parallel ranks \
                 (data.train_batch_size and data.val_batch_size must be multiples of the data-parallel size)"
            )));
        }
        let per = n / size;
        Ok(rank * per..(rank + 1) * per)
    }

    /// The main rank's `value` on every rank (the others pass `None`), through JSON.
    pub fn from_main<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        value: Option<T>,
    ) -> Result<T, TrainerError> {
        let missing = || bad("from_main: the main rank has no value to send");
        let Some(w) = &self.world else {
            return value.ok_or_else(missing);
        };
        let text = match (&value, w.rank() == 0) {
            (Some(v), true) => serde_json::to_string(v).map_err(|e| bad(e.to_string()))?,
            (None, true) => return Err(missing()),
            (_, false) => String::new(),
        };
        let text = w.broadcast_text(&text, 0).map_err(dist)?;
        serde_json::from_str(&text).map_err(|e| bad(format!("from_main: {e}")))
    }

    pub fn barrier(&self) -> Result<(), TrainerError> {
        match &self.world {
            Some(w) => w.barrier().map_err(dist),
            None => Ok(()),
        }
    }

    /// The largest of `v` over the data-parallel group.
    pub fn max(&self, v: i64) -> Result<i64, TrainerError> {
        let Some(g) = &self.group else { return Ok(v) };
        let t = Tensor::from_slice(&[v]);
        g.all_reduce(&t, ReduceOp::Max).map_err(dist)?;
        Ok(t.int64_value(&[0]))
    }

    /// Rank 0's value of `v` on every rank of the world.
    pub fn broadcast_from_main(&self, v: i64) -> Result<i64, TrainerError> {
        let Some(w) = &self.world else { return Ok(v) };
        let t = Tensor::from_slice(&[v]);
        w.broadcast(&t, 0).map_err(dist)?;
        Ok(t.int64_value(&[0]))
    }

    /// The rows of every data-parallel rank, in rank order (all ranks pass tensors of the
    /// same shape).
    pub fn gather_rows(&self, t: &Tensor) -> Result<Tensor, TrainerError> {
        let Some(g) = &self.group else {
            return Ok(t.shallow_clone());
        };
        let t = t.f_contiguous()?;
        let mut shape = t.size();
        shape[0] *= g.size() as i64;
        let out = Tensor::f_empty(shape.as_slice(), (t.kind(), t.device()))?;
        g.all_gather_into(&out, &t).map_err(dist)?;
        Ok(out)
    }

    /// Every tensor of `batch` gathered over the data-parallel group.
    pub fn gather_batch(&self, batch: &Batch) -> Result<Batch, TrainerError> {
        if self.group.is_none() {
            return Ok(batch.shallow_clone());
        }
        let mut out = Batch::new();
        let names: Vec<String> = batch.names().map(str::to_owned).collect();
        for name in names {
            out.insert(&name, self.gather_rows(batch.get(&name)?)?)?;
        }
        Ok(out)
    }

    /// Each of `v` summed over every rank of the world.
    pub fn world_sums(&self, v: &[f64]) -> Result<Vec<f64>, TrainerError> {
        let Some(w) = &self.world else {
            return Ok(v.to_vec());
        };
        let t = Tensor::from_slice(v);
        w.all_reduce(&t, ReduceOp::Sum).map_err(dist)?;
        Ok(Vec::<f64>::try_from(&t)?)
    }

    /// The sum of `v` over the data-parallel group.
    pub fn sum(&self, v: i64) -> Result<i64, TrainerError> {
        let Some(g) = &self.group else { return Ok(v) };
        let t = Tensor::from_slice(&[v]);
        g.all_reduce(&t, ReduceOp::Sum).map_err(dist)?;
        Ok(t.int64_value(&[0]))
    }

    /// Every rank's rows of `batch`, in rank order, when ranks hold different numbers of rows
    /// (the tensors' other dimensions agree): each is padded with zero rows to the largest
    /// count for the all-gather, and the padding dropped after.
    pub fn gather_uneven(&self, batch: &Batch) -> Result<Batch, TrainerError> {
        if self.group.is_none() {
            return Ok(batch.shallow_clone());
        }
        let rows = batch.rows();
        let counts = Vec::<i64>::try_from(self.gather_rows(&Tensor::from_slice(&[rows]))?)?;
        let most = counts.iter().copied().max().unwrap_or(0);
        let mut padded = Batch::new();
        let names: Vec<String> = batch.names().map(str::to_owned).collect();
        for name in &names {
            let t = batch.get(name)?;
            let mut shape = t.size();
            shape[0] = most - rows;
            let fill = Tensor::f_zeros(shape.as_slice(), (t.kind(), t.device()))?;
            padded.insert(name, Tensor::f_cat(&[t.shallow_clone(), fill], 0)?)?;
        }
        let all = self.gather_batch(&padded)?;
        let keep: Vec<i64> = counts
            .iter()
            .enumerate()
            .flat_map(|(r, &c)| (0..c).map(move |i| r as i64 * most + i))
            .collect();
        Ok(all.select(&keep)?)
    }

    /// This rank's rows of a gathered batch.
    pub fn own_rows(&self, full: &Batch) -> Result<Batch, TrainerError> {
        if self.group.is_none() {
            return Ok(full.shallow_clone());
        }
        let per = full.rows() / self.size() as i64;
        Ok(full.narrow(self.rank() as i64 * per, per)?)
    }

    /// Per-rank worker metrics averaged over the data-parallel group (verl reduces the
    /// metric lists of all workers with a mean). Every rank reports the same names.
    pub fn mean_metrics(&self, m: Metrics) -> Result<Metrics, TrainerError> {
        let Some(g) = &self.group else { return Ok(m) };
        let names = self.max(m.len() as i64)?;
        if names != m.len() as i64 {
            return Err(bad(format!(
                "data-parallel ranks report different metrics ({} here, {names} elsewhere)",
                m.len()
            )));
        }
        let values: Vec<f64> = m.values().copied().collect();
        let t = Tensor::from_slice(&values);
        g.all_reduce(&t, ReduceOp::Sum).map_err(dist)?;
        let n = g.size() as f64;
        let summed = Vec::<f64>::try_from(&t)?;
        Ok(m.into_keys().zip(summed).map(|(k, v)| (k, v / n)).collect())
    }
}

/// Left-pads the prompt side of a rollout batch to `width` prompt columns (pad id, attention
/// 0, position 1 as transformers), so that every data-parallel rank's rows have one shape.
pub fn pad_prompts(batch: &mut Batch, width: i64, pad_id: i64) -> Result<(), TrainerError> {
    let p = batch.get("prompts")?.size()[1];
    let extra = width - p;
    if extra <= 0 {
        return Ok(());
    }
    for (key, fill) in [
        ("prompts", pad_id),
        ("input_ids", pad_id),
        ("attention_mask", 0),
        ("position_ids", 1),
    ] {
        let t = batch.get(key)?;
        // Multimodal positions `(N, T, 3)` pad every axis.
        let mut shape = t.size();
        shape[1] = extra;
        let pad = Tensor::f_full(shape.as_slice(), fill, (t.kind(), t.device()))?;
        let padded = Tensor::f_cat(&[pad, t.shallow_clone()], 1)?;
        batch.insert(key, padded)?;
    }
    Ok(())
}
