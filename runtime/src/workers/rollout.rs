//! The rollout side of the hybrid engine (verl's `update_weights` + vLLM's sleep/wake-up):
//! a model skeleton in the rollout dtype (`rollout.dtype`) that holds weights only while it
//! generates. [`RolloutWorker::update_weights`] binds the trainer's full tensors to it (no
//! copy when the dtype and device already match: the rollout reads the actor's own storage,
//! or the engine's freshly gathered full parameters), [`RolloutWorker::release`] drops them
//! again, so no second copy of the policy lives on through training. A LoRA policy's adapters
//! are merged into the weights they adapt as they arrive, so generation runs a plain model.
//!
//! On a Megatron actor the skeleton is the rank's own shards ([`RolloutLayout::Sharded`]):
//! its pipeline stage's layers and its tensor-parallel slice, bound to the engine's local
//! parameters and decoded with the other ranks of the model ([`ShardedDecoder`]), so the
//! rollout holds `1 / (TP × PP)` of the weights, like training. At another rollout TP size
//! the skeleton is this rank's part of the rollout's layout and its replica shares the
//! prompts with the others ([`ReplicaShare`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use tch::nn::VarStore;
use tch::{Device, Tensor};

use crate::engine::batch::RowImages;
use crate::engine::megatron::{HeadKind, ParallelModel};
use crate::model::{CausalLm, Dtype, ModelConfig, TorchKind};
use crate::parallel::dist::ProcessGroup;
use crate::rollout::vllm::{MidBatchWeights, VisionServing, VllmRollout, VllmSpec};
use crate::rollout::{
    GenerateInput, PromptStream, ReplicaShare, RolloutError, RolloutLayout, RolloutOutput,
    SamplingParams, ShardLayout, ShardedDecoder, StopTokens, generate_interruptible,
};
use crate::workers::rollout_pool::{RankPool, ReplicaCommand, ReplicaPlace};

use super::{Result, WorkerError};

/// The model the rollout decodes with.
enum Skeleton {
    Full(Box<CausalLm>),
    Sharded {
        model: Box<ParallelModel>,
        pp: Option<ProcessGroup>,
        share: Option<ReplicaShare>,
    },
    /// `rollout.name: vllm`: a vLLM server generates; the worker holds no weights.
    Vllm(Box<VllmRollout>),
    /// `separate_async`'s built-in pool: the rank's replica processes generate; the worker
    /// holds no weights.
    Replica(Box<RankPool>),
}

/// The generator of the hybrid engine.
pub struct RolloutWorker {
    vs: VarStore,
    model: Skeleton,
    pub dtype: Dtype,
    /// Shape of every parameter (what [`RolloutWorker::update_weights`] must receive).
    shapes: BTreeMap<String, Vec<i64>>,
    /// True while weights are bound.
    loaded: bool,
    /// The policy's LoRA adapters, merged on every sync.
    lora: Option<crate::model::lora::LoraConfig>,
    /// Where a rollout beside the trainer finds newer weights while it decodes (partial
    /// rollout); `None`: a batch decodes with the weights it started with.
    source: Option<Arc<dyn WeightSource>>,
}

/// Newer weights for a rollout that is decoding (verl's partial rollout: in-flight requests
/// continue with the weights of the latest sync).
pub trait WeightSource: Send + Sync {
    /// The newest weights (whole tensors by name, as [`RolloutWorker::update_weights`] takes
    /// them) with their version when there are newer ones than the last taken; may block
    /// while the rollout is paused, and fails when the run has ended.
    fn poll(&self) -> std::result::Result<Option<VersionedWeights>, String>;

    /// Whether the trainer has paused the rollout (until its next weights).
    fn paused(&self) -> bool {
        false
    }
}

pub use crate::rollout::VersionedWeights;

impl std::fmt::Debug for RolloutWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutWorker")
            .field("dtype", &self.dtype)
            .field("loaded", &self.loaded)
            .finish_non_exhaustive()
    }
}

impl RolloutWorker {
    /// A model of `config` in `dtype` on `device` without weights; call
    /// [`RolloutWorker::update_weights`] before generating.
    pub fn new(config: &ModelConfig, dtype: Dtype, device: Device) -> Result<Self> {
        let vs = VarStore::new(device);
        let lora = config.lora.clone();
        let plain = ModelConfig {
            lora: None,
            ..config.clone()
        };
        let model = CausalLm::new(&plain, vs.root()).map_err(WorkerError::Config)?;
        Self::with_skeleton(vs, Skeleton::Full(Box::new(model)), dtype, lora)
    }

    /// The rollout model for `layout` (what the actor's engine reports).
    pub fn for_layout(layout: &RolloutLayout, dtype: Dtype, device: Device) -> Result<Self> {
        match layout {
            RolloutLayout::Full(config) => Self::new(config, dtype, device),
            RolloutLayout::Sharded(shards) => Self::sharded(shards, dtype, device),
        }
    }

    /// This rank's shards of the model (a Megatron actor's layout) in `dtype`, without weights.
    pub fn sharded(layout: &ShardLayout, dtype: Dtype, device: Device) -> Result<Self> {
        if layout.config.lora.is_some() {
            return Err(WorkerError::Config(
                "a sharded (Megatron) rollout does not merge LoRA adapters".into(),
            ));
        }
        let vs = VarStore::new(device);
        let model = ParallelModel::new(
            &layout.config,
            &vs,
            HeadKind::CausalLm,
            layout.stage.clone(),
            layout.tp.clone(),
            false,
        )
        .map_err(|e| WorkerError::Config(e.to_string()))?;
        let skeleton = Skeleton::Sharded {
            model: Box::new(model),
            pp: layout.pp.clone(),
            share: layout.share.clone(),
        };
        Self::with_skeleton(vs, skeleton, dtype, None)
    }

    /// The vLLM rollout of `config` (`rollout.name: vllm`): its server starts at the first
    /// [`RolloutWorker::update_weights`], on the group's rank 0 (the whole process when
    /// `group` is `None`); every rank generates through it.
    pub fn vllm(
        config: &ModelConfig,
        dtype: Dtype,
        spec: VllmSpec,
        seed: u64,
        device: Device,
        group: Option<ProcessGroup>,
    ) -> Result<Self> {
        let plain = ModelConfig {
            lora: None,
            ..config.clone()
        };
        let rollout = VllmRollout::new(&plain, dtype, spec, seed, device.is_cuda(), group);
        Ok(RolloutWorker {
            vs: VarStore::new(device),
            model: Skeleton::Vllm(Box::new(rollout)),
            dtype,
            shapes: BTreeMap::new(),
            loaded: false,
            lora: config.lora.clone(),
            source: None,
        })
    }

    /// The built-in rollout of `config` in replica processes of their own (`separate_async`'s
    /// pool), started by `command`, one at each of `places`; the policy's LoRA adapters are
    /// merged here before each sync.
    pub fn replica(
        config: &ModelConfig,
        dtype: Dtype,
        command: &ReplicaCommand,
        places: &[ReplicaPlace],
    ) -> Result<Self> {
        let plain = ModelConfig {
            lora: None,
            ..config.clone()
        };
        let replica = RankPool::start(command, &plain, dtype, places)
            .map_err(|e| WorkerError::Config(e.to_string()))?;
        Ok(RolloutWorker {
            vs: VarStore::new(Device::Cpu),
            model: Skeleton::Replica(Box::new(replica)),
            dtype,
            shapes: BTreeMap::new(),
            loaded: false,
            lora: config.lora.clone(),
            source: None,
        })
    }

    /// Whether [`RolloutWorker::update_weights`] takes whole tensors by checkpoint name (a
    /// vLLM server's, or the built-in whole model's) rather than a Megatron rank's shards.
    pub fn takes_whole_tensors(&self) -> bool {
        matches!(
            self.model,
            Skeleton::Vllm(_) | Skeleton::Full(_) | Skeleton::Replica(_)
        )
    }

    /// A vLLM rollout whose server generates while the trainer computes (the asynchronous
    /// modes): see [`VllmRollout::share_cores`]. Nothing for the built-in rollouts.
    pub fn share_cores_with_trainer(&mut self) {
        if let Skeleton::Vllm(v) = &mut self.model {
            v.share_cores();
        }
    }

    /// A vLLM rollout of a vision-language policy whose prompts carry images: see
    /// [`VllmRollout::serve_images`]. Nothing for the built-in rollouts (their model has the
    /// tower).
    pub fn serve_images(&mut self, vision: VisionServing) -> Result<()> {
        if let Skeleton::Vllm(v) = &mut self.model {
            v.serve_images(vision)
                .map_err(|e| WorkerError::Config(e.to_string()))?;
        }
        Ok(())
    }

    fn with_skeleton(
        mut vs: VarStore,
        model: Skeleton,
        dtype: Dtype,
        lora: Option<crate::model::lora::LoraConfig>,
    ) -> Result<Self> {
        vs.set_kind(dtype.kind());
        vs.freeze();
        let shapes = vs
            .variables()
            .into_iter()
            .map(|(n, t)| (n, t.size()))
            .collect();
        let mut w = RolloutWorker {
            vs,
            model,
            dtype,
            shapes,
            loaded: true,
            lora,
            source: None,
        };
        w.release()?;
        Ok(w)
    }

    /// Binds `params` (every parameter by checkpoint name: full tensors, or this rank's
    /// shards for a sharded rollout) to the rollout model, converted to the rollout dtype and
    /// device where they differ.
    pub fn update_weights(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        // A vLLM rollout's other ranks take part in the sync without weights (the server
        // reads the main rank's): nothing to merge there.
        if let Skeleton::Vllm(v) = &mut self.model
            && !v.is_main()
        {
            v.update_weights(&[])
                .map_err(|e| WorkerError::Config(e.to_string()))?;
            self.loaded = true;
            return Ok(());
        }
        let merged = self.merge_lora(params)?;
        let params = merged.as_deref().unwrap_or(params);
        if let Skeleton::Vllm(v) = &mut self.model {
            v.update_weights(params)
                .map_err(|e| WorkerError::Config(e.to_string()))?;
            self.loaded = true;
            return Ok(());
        }
        if let Skeleton::Replica(r) = &self.model {
            r.update_weights(params)
                .map_err(|e| WorkerError::Config(e.to_string()))?;
            self.loaded = true;
            return Ok(());
        }
        self.bind(params)?;
        self.loaded = true;
        Ok(())
    }

    /// `params` with the policy's LoRA adapters merged into the weights they adapt; `None`
    /// without adapters (`params` as they are).
    fn merge_lora(&self, params: &[(String, Tensor)]) -> Result<Option<Vec<(String, Tensor)>>> {
        let Some(lora) = &self.lora else {
            return Ok(None);
        };
        let all = params
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        Ok(Some(crate::model::lora::merged(all, lora)?))
    }

    /// Binds `params` (LoRA already merged) to this process's model: the variables take
    /// their storage, so a model that is decoding sees them at its next step.
    fn bind(&self, params: &[(String, Tensor)]) -> Result<()> {
        if params.len() != self.shapes.len() {
            return Err(WorkerError::Config(format!(
                "weight sync: the trainer sent {} tensors, the rollout model has {}",
                params.len(),
                self.shapes.len()
            )));
        }
        let vars = self.vs.variables();
        let (kind, device) = (self.dtype.kind(), self.vs.device());
        tch::no_grad(|| -> Result<()> {
            for (name, src) in params {
                let (Some(shape), Some(var)) = (self.shapes.get(name), vars.get(name)) else {
                    return Err(WorkerError::Config(format!(
                        "weight sync: the rollout model has no `{name}`"
                    )));
                };
                if &src.size() != shape {
                    return Err(WorkerError::Config(format!(
                        "weight sync: `{name}` is {:?} in the trainer, {shape:?} in the rollout model",
                        src.size()
                    )));
                }
                let data = src.f_detach()?.f_to(device)?.f_to_kind(kind)?;
                var.shallow_clone().f_set_data(&data)?;
            }
            Ok(())
        })
    }

    /// Lets a whole-model rollout, replica processes or a vLLM server take newer weights from
    /// `source` while they decode (verl's partial rollout); a Megatron rank's shards finish a
    /// batch with the weights it started with.
    pub fn swap_weights_from(&mut self, source: Arc<dyn WeightSource>) {
        if matches!(
            self.model,
            Skeleton::Full(_) | Skeleton::Replica(_) | Skeleton::Vllm(_)
        ) {
            self.source = Some(source);
        }
    }

    /// The source's newer weights bound between two decoded tokens (a whole model's): their
    /// version.
    fn take_newer(&self) -> Result<Option<u64>> {
        let Some((version, params)) = self.newer_merged().map_err(WorkerError::Config)? else {
            return Ok(None);
        };
        self.bind(&params)?;
        Ok(Some(version))
    }

    /// Binds `params` (as [`RolloutWorker::update_weights`] takes them) to a whole model that
    /// may be decoding: it generates with them from its next step (partial rollout).
    pub fn bind_newer(&self, params: &[(String, Tensor)]) -> Result<()> {
        if !matches!(self.model, Skeleton::Full(_)) {
            return Err(WorkerError::Config(
                "only a whole-model rollout takes weights while it decodes".into(),
            ));
        }
        let merged = self.merge_lora(params)?;
        self.bind(merged.as_deref().unwrap_or(params))
    }

    /// The source's newer weights with the policy's LoRA adapters merged, as a replica pool
    /// takes them.
    fn newer_merged(&self) -> std::result::Result<Option<VersionedWeights>, String> {
        let Some(source) = &self.source else {
            return Ok(None);
        };
        let Some((version, params)) = source.poll()? else {
            return Ok(None);
        };
        let merged = self.merge_lora(&params).map_err(|e| e.to_string())?;
        Ok(Some((version, merged.unwrap_or(params))))
    }

    /// Drops the weights (the rollout's "sleep"): the model keeps empty tensors until the
    /// next [`RolloutWorker::update_weights`].
    pub fn release(&mut self) -> Result<()> {
        if !self.loaded {
            return Ok(());
        }
        if let Skeleton::Vllm(v) = &mut self.model {
            // On CUDA with `free_cache_engine` the server sleeps (frees its weights and KV
            // cache) until the next sync; vLLM has no sleep mode on CPU, where it keeps them.
            v.sleep().map_err(|e| WorkerError::Config(e.to_string()))?;
            self.loaded = false;
            return Ok(());
        }
        if let Skeleton::Replica(_) = &self.model {
            // The replica's weights live in its own process, on its own memory.
            return Ok(());
        }
        let (kind, device) = (self.dtype.kind(), self.vs.device());
        for (_, var) in self.vs.variables() {
            var.shallow_clone()
                .f_set_data(&Tensor::f_empty([0], (kind, device))?)?;
        }
        self.loaded = false;
        Ok(())
    }

    /// The end of a run, on every rank: a vLLM rollout waits until every rank is done with
    /// the main rank's server (which stops when the main rank's worker drops), so a rank
    /// that finishes first does not take it from the others.
    pub fn finish(&mut self) -> Result<()> {
        if let Skeleton::Vllm(v) = &mut self.model {
            v.barrier()
                .map_err(|e| WorkerError::Config(e.to_string()))?;
        }
        Ok(())
    }

    /// True while weights are bound.
    pub fn is_loaded(&self) -> bool {
        self.loaded
    }

    /// Bytes of the weights the rollout model holds now.
    pub fn weight_bytes(&self) -> i64 {
        self.vs
            .variables()
            .values()
            .map(crate::ops::tensor_bytes)
            .sum()
    }

    fn require_weights(&self) -> Result<()> {
        if self.loaded {
            Ok(())
        } else {
            Err(WorkerError::Config(
                "the rollout model has no weights (update_weights first)".into(),
            ))
        }
    }

    /// Generates `params.n` responses per prompt.
    pub fn generate(
        &self,
        prompts: &[Vec<i64>],
        params: &SamplingParams,
        stop: &StopTokens,
    ) -> Result<RolloutOutput> {
        self.generate_images(prompts, &[], params, stop)
    }

    /// [`RolloutWorker::generate`] of prompts with images (`images[i]` those of `prompts[i]`;
    /// empty: no prompt has any): a vision-language model's.
    pub fn generate_images(
        &self,
        prompts: &[Vec<i64>],
        images: &[RowImages],
        params: &SamplingParams,
        stop: &StopTokens,
    ) -> Result<RolloutOutput> {
        let Skeleton::Sharded { model, pp, share } = &self.model else {
            let streams = PromptStream::consecutive(params.seed, 0, prompts.len());
            return self.generate_streams_images(prompts, images, &streams, params, stop);
        };
        self.require_weights()?;
        let decoder = ShardedDecoder {
            model,
            pp: pp.as_ref(),
        };
        // A replica laid out apart from training shares the prompts, with their images.
        Ok(match share {
            Some(share) => share.generate(&decoder, prompts, images, params, stop)?,
            None => {
                let streams = PromptStream::consecutive(params.seed, 0, prompts.len());
                crate::rollout::generate_images(
                    &decoder, prompts, images, &streams, params, stop, None,
                )?
            }
        })
    }

    /// [`RolloutWorker::generate_streams`] of prompts with images (`images[i]` those of
    /// `prompts[i]`; empty: none): the agent loop's turns of a vision-language policy.
    pub fn generate_streams_images(
        &self,
        prompts: &[Vec<i64>],
        images: &[RowImages],
        streams: &[PromptStream],
        params: &SamplingParams,
        stop: &StopTokens,
    ) -> Result<RolloutOutput> {
        self.require_weights()?;
        Ok(match &self.model {
            Skeleton::Full(model) => {
                let input = GenerateInput {
                    prompts,
                    images,
                    streams,
                    prompt_width: None,
                };
                let mut swap = || -> std::result::Result<Option<u64>, RolloutError> {
                    self.take_newer()
                        .map_err(|e| RolloutError::Batch(format!("new weights: {e}")))
                };
                generate_interruptible(model.as_ref(), input, params, stop, &mut swap)?
            }
            Skeleton::Vllm(v) => match &self.source {
                // The rank that owns the server pauses it and syncs it mid-batch.
                Some(source) if v.is_main() => {
                    let mut paused = || source.paused();
                    let mut newer = || self.newer_merged();
                    let mut weights = MidBatchWeights {
                        paused: &mut paused,
                        newer: &mut newer,
                    };
                    v.generate_swapping(prompts, images, streams, params, stop, Some(&mut weights))?
                }
                _ => v.generate_images(prompts, images, streams, params, stop)?,
            },
            Skeleton::Replica(r) => match &self.source {
                Some(_) => r.generate_swapping(prompts, images, streams, params, stop, &mut || {
                    self.newer_merged()
                }),
                None => r.generate(prompts, images, streams, params, stop),
            }
            .map_err(|e| WorkerError::Config(e.to_string()))?,
            // A replica of this rank's own (and its tensor/pipeline peers', which must call
            // alike): the streams are generated as given; its first stage embeds the images.
            Skeleton::Sharded {
                model,
                pp,
                share: None,
            } => {
                let decoder = ShardedDecoder {
                    model,
                    pp: pp.as_ref(),
                };
                crate::rollout::generate_images(
                    &decoder, prompts, images, streams, params, stop, None,
                )?
            }
            // A replica shared with other data-parallel ranks gathers whole batches.
            Skeleton::Sharded { share: Some(_), .. } => {
                return Err(WorkerError::Config(
                    "a rollout replica shared by several data-parallel ranks generates whole batches only".into(),
                ));
            }
        })
    }

    /// Generates with each prompt's sampling stream given (`streams[i]` for `prompts[i]`;
    /// the agent loop's turns keep a row's stream as the batch shrinks). The whole-model and
    /// vLLM rollouts, and a Megatron rank's own replica.
    pub fn generate_streams(
        &self,
        prompts: &[Vec<i64>],
        streams: &[PromptStream],
        params: &SamplingParams,
        stop: &StopTokens,
    ) -> Result<RolloutOutput> {
        self.generate_streams_images(prompts, &[], streams, params, stop)
    }

    /// A vision-language model's vision tokens (what its prompts' multimodal positions
    /// depend on), whole model or Megatron shards.
    pub fn vision_tokens(&self) -> Option<&crate::model::vision::MropeTokens> {
        match &self.model {
            Skeleton::Full(m) => m.vision.as_ref().map(|v| &v.tokens),
            Skeleton::Sharded { model, .. } => model.mrope(),
            Skeleton::Replica(r) => r.vision_tokens(),
            Skeleton::Vllm(v) => v.vision_tokens(),
        }
    }

    /// The whole model, unless the rollout is sharded.
    pub fn model(&self) -> Option<&CausalLm> {
        match &self.model {
            Skeleton::Full(m) => Some(m),
            Skeleton::Sharded { .. } | Skeleton::Vllm(_) | Skeleton::Replica(_) => None,
        }
    }

    /// The vLLM rollout, when `rollout.name` is `vllm`.
    pub fn vllm_rollout(&self) -> Option<&VllmRollout> {
        match &self.model {
            Skeleton::Vllm(v) => Some(v),
            _ => None,
        }
    }

    /// This rank's rollout replica's tensor and pipeline groups, where they span ranks.
    fn replica_groups(&self) -> (Option<&ProcessGroup>, Option<&ProcessGroup>) {
        match &self.model {
            Skeleton::Sharded { model, pp, .. } => (
                model.tp().filter(|g| g.size() > 1),
                pp.as_ref().filter(|g| g.size() > 1),
            ),
            _ => (None, None),
        }
    }

    /// Whether this rank's rollout replica spans several ranks (Megatron tensor or pipeline
    /// parallelism), which decode in lockstep.
    pub fn replica_spans_ranks(&self) -> bool {
        let (tp, pp) = self.replica_groups();
        tp.is_some() || pp.is_some()
    }

    /// Whether this rank leads its rollout replica: the one rank that runs the agent loop's
    /// tools when a replica spans ranks (tensor rank 0 on the first pipeline stage); every
    /// rank of a replica of one.
    pub fn leads_replica(&self) -> bool {
        let (tp, pp) = self.replica_groups();
        tp.is_none_or(|g| g.rank() == 0) && pp.is_none_or(|g| g.rank() == 0)
    }

    /// The leader's `text` ([`RolloutWorker::leads_replica`]) on every rank of this rank's
    /// rollout replica (collective over it; `text` is read on the leader only): over the
    /// pipeline stages' tensor-rank-0 ranks, then over each stage's tensor group. A replica
    /// of one: `text` itself.
    pub fn share_with_replica(&self, text: &str) -> Result<String> {
        let dist = |e: crate::parallel::dist::DistError| WorkerError::Config(e.to_string());
        let (tp, pp) = self.replica_groups();
        let mut text = text.to_owned();
        if tp.is_none_or(|g| g.rank() == 0)
            && let Some(pp) = pp
        {
            text = pp.broadcast_text(&text, 0).map_err(dist)?;
        }
        if let Some(tp) = tp {
            text = tp.broadcast_text(&text, 0).map_err(dist)?;
        }
        Ok(text)
    }

    /// True when this rank holds only its shards of the model.
    pub fn is_sharded(&self) -> bool {
        matches!(self.model, Skeleton::Sharded { .. })
    }
}
