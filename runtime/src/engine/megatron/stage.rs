//! One (TP rank, PP stage) of the model (Megatron's `GPTModel` on `TransformerBlock`): the
//! layers are [`crate::model::decoder`]'s, built over the TP size for this stage's layer range,
//! with the same variable names as the Hugging Face checkpoint so sharded loading and export
//! need no renaming table. This file adds what a stage has around them.
//!
//! - Tensor parallelism: q/k/v and gate/up are column-split (heads and the intermediate
//!   size split), o and down row-split; the embedding and the output layer are split by
//!   vocabulary ([`VocabParallelEmbedding`]), and the log-probs come from
//!   [`vocab_parallel_log_probs`]. Norms and row-split biases are replicated.
//! - Pipeline parallelism: stage `s` of `pp` holds a contiguous range of layers
//!   ([`Stage`]); the first stage also holds the embedding, the last the final norm and the
//!   head. With tied embeddings and several stages the last stage holds its own copy of the
//!   embedding (`model.embed_tokens.weight` again, Megatron's `shared_embedding`), kept equal
//!   to the first stage's by summing their gradients over the embedding group.
//!
//! A training forward runs on one stage through [`TrainingRegions`], recording its cuts on a
//! [`Tape`] (see [`crate::parallel::mappings`]): under tensor parallelism each layer is four
//! segments. Decoding ([`ParallelModel::decode_stage`], the rollout on a Megatron rank) runs
//! the same layers through [`InferenceRegions`] with a KV cache of this stage's layers and
//! this rank's key/value heads.
use std::ops::Range;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::logits::TokenStats;
use crate::logits::topk::{TopK, TopKTargets};
use crate::model::decoder::{
    DecoderLayer, LayerPlace, Linear, RmsNorm, param_shapes, with_deepstack,
};
use crate::model::heads::soft_cap;
use crate::model::moe::RouterLossCoeffs;
use crate::model::rank_group::SharedRankGroup;
use crate::model::rope::RotaryEmbedding;
use crate::model::tensor_parallel::{ShardSpec, is_routed_expert_param, shard_spec, tp_gradient};
use crate::model::vision::{InputEmbeds, MropeTokens, Vision};
use crate::model::{KvCache, ModelConfig, causal_padding_mask};
use crate::parallel::dist::ProcessGroup;
use crate::parallel::mappings::{
    Tape, copy_to_tp_region, gather_from_sequence_parallel_region,
    gather_from_sequence_parallel_region_split_grad, scatter_to_sequence_parallel_region,
};
use crate::parallel::tp::regions::SEQ_DIM;
use crate::parallel::tp::{
    InferenceRegions, TrainingRegions, VocabParallelEmbedding, VocabParallelOutput, VocabPartition,
    rank_size, vocab_parallel_log_probs,
};

use super::{MegatronError, Result};
use crate::parallel::tp::context::ContextParallel;

/// The layers one pipeline stage holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub rank: usize,
    pub size: usize,
    /// Global indices of this stage's decoder layers.
    pub layers: Range<usize>,
}

impl Stage {
    /// Splits `num_layers` over `size` stages as evenly as possible (earlier stages take the
    /// remainder; Megatron requires an even split unless told otherwise).
    pub fn split(num_layers: usize, rank: usize, size: usize) -> Result<Self> {
        if size == 0 || rank >= size {
            return Err(MegatronError::Config(format!(
                "pipeline rank {rank} of {size}"
            )));
        }
        if num_layers < size {
            return Err(MegatronError::Config(format!(
                "{num_layers} layers cannot fill {size} pipeline stages"
            )));
        }
        let (base, extra) = (num_layers / size, num_layers % size);
        let start = rank * base + rank.min(extra);
        let len = base + usize::from(rank < extra);
        Ok(Stage {
            rank,
            size,
            layers: start..start + len,
        })
    }

    pub fn single(num_layers: usize) -> Self {
        Stage {
            rank: 0,
            size: 1,
            layers: 0..num_layers,
        }
    }

    pub fn is_first(&self) -> bool {
        self.rank == 0
    }

    pub fn is_last(&self) -> bool {
        self.rank + 1 == self.size
    }
}

/// What the model's last stage computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadKind {
    /// `*ForCausalLM`: the (vocab-parallel) output layer.
    CausalLm,
    /// `*ForTokenClassification` with one label: a replicated `score` layer (the critic).
    Value,
}

impl HeadKind {
    /// The prefix of the metrics of the role that trains this head.
    pub fn metric_role(self) -> &'static str {
        match self {
            HeadKind::CausalLm => "actor",
            HeadKind::Value => "critic",
        }
    }
}

/// How a parameter is distributed, for the optimizer and the export.
#[derive(Debug)]
pub struct ParamInfo {
    pub name: String,
    pub tensor: Tensor,
    /// Split over the TP group (false: replicated, identical on every TP rank).
    pub tensor_parallel: bool,
    /// The tied embedding / output weight when stages differ (also on the other stage).
    pub shared_embedding: bool,
    /// The copy of the embedding held by the last stage (not counted in norms, not exported).
    pub output_copy: bool,
    pub is_embedding_or_output: bool,
    /// Replicated, but each TP rank's gradient is only a part (summed over TP before the
    /// step): q/k norms (each rank sees its heads) and, under sequence parallelism, the
    /// params applied to sequence chunks (norms, row-parallel biases).
    pub grad_partial_over_tp: bool,
    /// Not split over TP, yet different on the TP ranks: whole experts (expert tensor
    /// parallel 1) split over an expert-parallel group that spans tensor ranks. Each rank's
    /// copy counts in the grad norm.
    pub differs_over_tp: bool,
}

/// Where a mixture-of-experts model's routed experts live on a Megatron rank.
#[derive(Debug, Clone)]
pub struct ExpertPlacement {
    /// The expert-parallel group over which the experts are split (`None`: all on this rank).
    pub group: Option<ProcessGroup>,
    /// Each expert's MLP split over the tensor-parallel group (Megatron's expert tensor
    /// parallelism = TP), or whole (expert TP 1: each tensor rank routes its share of the
    /// tokens, see [`crate::model::moe::SparseMoe::try_share`]).
    pub split_over_tp: bool,
}

impl Default for ExpertPlacement {
    fn default() -> Self {
        ExpertPlacement {
            group: None,
            split_over_tp: true,
        }
    }
}

/// Names and full shapes of the parameters stage `stage` holds (HF layout), in model order;
/// the last stage's copy of a tied embedding is left out.
pub fn full_shapes(cfg: &ModelConfig, head: HeadKind, stage: &Stage) -> Vec<(String, Vec<i64>)> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let last = stage.is_last();
    let mut out = param_shapes(cfg, stage.layers.clone(), stage.is_first(), last);
    match head {
        HeadKind::CausalLm if last && !cfg.tie_word_embeddings => {
            out.push(("lm_head.weight".into(), vec![v, h]))
        }
        HeadKind::Value if last => {
            out.push(("score.weight".into(), vec![1, h]));
            out.push(("score.bias".into(), vec![1]));
        }
        HeadKind::CausalLm | HeadKind::Value => {}
    }
    out
}

fn tp_err(e: crate::parallel::tp::TpError) -> MegatronError {
    MegatronError::Tp(e)
}

/// Parameter names with their full shapes.
type Shapes = Vec<(String, Vec<i64>)>;

/// Input of a stage: token ids on the first stage (with their images for a vision-language
/// model), the previous stage's hidden states (a [`Tape::input`] leaf) on the others.
#[derive(Debug)]
pub enum StageInput<'a> {
    Ids(&'a Tensor),
    Multimodal(&'a Tensor, StageImages<'a>),
    Hidden(Tensor),
}

/// The images and videos of a micro-batch's rows, for the first stage of a vision-language
/// model.
#[derive(Debug, Clone, Copy)]
pub struct StageImages<'a> {
    /// Their patches `(Σ t·h·w, patch_width)`, item after item in placeholder order.
    pub pixels: &'a Tensor,
    pub grids: &'a [[i64; 3]],
    /// Which items are videos (their rows fill the video placeholders; empty: none is).
    pub videos: &'a [bool],
    /// The columns that hold the prompts (a placeholder token sampled in a response keeps its
    /// token embedding).
    pub prompt_width: i64,
}

/// The decoder of one (TP rank, PP stage); see the module docs.
#[derive(Debug)]
pub struct ParallelModel {
    pub config: ModelConfig,
    pub head_kind: HeadKind,
    pub stage: Stage,
    tp: Option<ProcessGroup>,
    /// Megatron's sequence parallelism (only with a TP group).
    sequence_parallel: bool,
    /// Context parallelism: this rank holds `1 / CP` of each sequence's positions.
    cp: Option<ContextParallel>,
    /// The router losses of the mixture-of-experts layers (`None`: none).
    router: Option<RouterLossCoeffs>,
    partition: VocabPartition,
    embed: Option<VocabParallelEmbedding>,
    layers: Vec<DecoderLayer>,
    norm: Option<RmsNorm>,
    /// Untied `lm_head`, or the last stage's copy of a tied embedding (`None` when the
    /// embedding on this stage serves as output layer, or for a value head).
    output: Option<VocabParallelEmbedding>,
    score: Option<Linear>,
    rotary: RotaryEmbedding,
    /// A vision-language model's tower, whole on every tensor-parallel rank of the first
    /// stage (Megatron-Bridge splits its linear layers over the group; whole, the numbers are
    /// the same); `None` elsewhere.
    vision: Option<Vision>,
    /// Names and shapes of the tower's parameters (every stage knows them, to receive the
    /// first stage's in [`ParallelModel::stage_shapes`]); empty for a text model.
    tower_shapes: Shapes,
    /// A vision-language model's vision tokens, on every stage (each computes the prompts'
    /// multimodal positions).
    mrope: Option<MropeTokens>,
    /// How many decoder layers (from the first) take the tower's DeepStack features; 0 for
    /// a model without them.
    deepstack_levels: usize,
    names: Vec<(String, Tensor)>,
    /// See [`ExpertPlacement::split_over_tp`].
    experts_split_over_tp: bool,
    /// The experts are split over an expert-parallel group of more than one rank.
    expert_parallel: bool,
}

impl ParallelModel {
    /// Registers this rank's variables in `vs`, which holds nothing else (HF names, local
    /// shapes). `tp` is the tensor-parallel group (`None` for one rank); `sequence_parallel`
    /// splits the sequence over it outside the tensor-parallel layers (ignored without one).
    pub fn new(
        cfg: &ModelConfig,
        vs: &VarStore,
        head: HeadKind,
        stage: Stage,
        tp: Option<ProcessGroup>,
        sequence_parallel: bool,
    ) -> Result<Self> {
        let experts = ExpertPlacement::default();
        Self::with_experts(cfg, vs, head, stage, tp, sequence_parallel, experts)
    }

    /// [`ParallelModel::new`] with the mixture-of-experts layers' experts placed as `experts`
    /// says (over an expert-parallel group this rank holds its consecutive share).
    pub fn with_experts(
        cfg: &ModelConfig,
        vs: &VarStore,
        head: HeadKind,
        stage: Stage,
        tp: Option<ProcessGroup>,
        sequence_parallel: bool,
        experts: ExpertPlacement,
    ) -> Result<Self> {
        let root = vs.root();
        cfg.validate().map_err(MegatronError::Config)?;
        let split = experts.split_over_tp && tp.as_ref().is_some_and(|g| g.size() > 1);
        if let Some(what) = cfg.megatron_gap(false, split) {
            return Err(MegatronError::Config(format!(
                "{what} on the Megatron engine: not implemented (`verlc build` refuses it)"
            )));
        }
        if stage.layers.end > cfg.num_hidden_layers as usize {
            return Err(MegatronError::Config(format!(
                "stage layers {:?} beyond the model's {}",
                stage.layers, cfg.num_hidden_layers
            )));
        }
        let (tp_rank, tp_size) = rank_size(tp.as_ref());
        let partition = VocabPartition::new(cfg.vocab_size, tp_rank, tp_size).map_err(tp_err)?;
        let model = &root / "model";
        let embed = if stage.is_first() {
            Some(
                VocabParallelEmbedding::new(&model / "embed_tokens", partition, cfg.hidden_size)
                    .map_err(tp_err)?
                    .scaled(cfg.embedding_scale()),
            )
        } else {
            None
        };
        let expert_group = experts
            .group
            .clone()
            .map(|g| std::sync::Arc::new(g) as SharedRankGroup);
        let layers = stage
            .layers
            .clone()
            .map(|i| {
                let at = LayerPlace {
                    index: i,
                    slot: i - stage.layers.start,
                    tp: tp_size,
                    adapters: None,
                    experts: expert_group.as_ref(),
                    expert_tp: if experts.split_over_tp { tp_size } else { 1 },
                };
                DecoderLayer::build(cfg, &model / "layers" / i, at).map_err(MegatronError::Config)
            })
            .collect::<Result<Vec<_>>>()?;
        let last = stage.is_last();
        let norm = last.then(|| RmsNorm::of(cfg, &model / "norm", cfg.hidden_size));
        let (output, score) = match (head, last) {
            (_, false) => (None, None),
            (HeadKind::Value, true) => (
                None,
                Some(Linear::new(&root / "score", cfg.hidden_size, 1, true)),
            ),
            (HeadKind::CausalLm, true) if !cfg.tie_word_embeddings => (
                Some(
                    VocabParallelEmbedding::new(&root / "lm_head", partition, cfg.hidden_size)
                        .map_err(tp_err)?,
                ),
                None,
            ),
            (HeadKind::CausalLm, true) if !stage.is_first() => (
                Some(
                    VocabParallelEmbedding::new(
                        &model / "embed_tokens",
                        partition,
                        cfg.hidden_size,
                    )
                    .map_err(tp_err)?,
                ),
                None,
            ),
            (HeadKind::CausalLm, true) => (None, None),
        };
        let rotary = RotaryEmbedding::new(cfg, root.device()).map_err(MegatronError::Config)?;
        let (vision, tower_shapes) = Self::build_vision(cfg, vs, &stage)?;
        let deepstack_levels = if tower_shapes.is_empty() {
            0
        } else {
            Vision::deepstack_levels(cfg).map_err(MegatronError::Config)?
        };
        let mrope = if tower_shapes.is_empty() {
            None
        } else {
            Some(Vision::tokens_of(cfg).map_err(MegatronError::Config)?)
        };
        // Model order: embedding (the last stage's copy of a tied one too), layers in HF
        // registration order, final norm, head, the tower.
        let vars = vs.variables();
        let mut listed = full_shapes(cfg, head, &stage);
        if stage.is_first() {
            listed.extend(tower_shapes.iter().cloned());
        }
        const EMBED: &str = "model.embed_tokens.weight";
        let order = std::iter::once(EMBED).chain(
            listed
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| *n != EMBED),
        );
        let names: Vec<(String, Tensor)> = order
            .filter_map(|name| Some((name.to_owned(), vars.get(name)?.shallow_clone())))
            .collect();
        if names.len() != vars.len() {
            return Err(MegatronError::Config(format!(
                "stage {} registered {} variables, its listing names {}",
                stage.rank,
                vars.len(),
                names.len()
            )));
        }
        Ok(ParallelModel {
            config: cfg.clone(),
            head_kind: head,
            stage,
            sequence_parallel: sequence_parallel && tp.as_ref().is_some_and(|g| g.size() > 1),
            cp: None,
            router: None,
            tp,
            partition,
            embed,
            layers,
            norm,
            output,
            score,
            rotary,
            vision,
            tower_shapes,
            mrope,
            deepstack_levels,
            names,
            experts_split_over_tp: experts.split_over_tp,
            expert_parallel: experts.group.as_ref().is_some_and(|g| g.size() > 1),
        })
    }

    /// The first stage's vision tower (registered under `visual.` in `vs`) and every stage's
    /// listing of its parameters.
    fn build_vision(
        cfg: &ModelConfig,
        vs: &VarStore,
        stage: &Stage,
    ) -> Result<(Option<Vision>, Shapes)> {
        if !cfg.arch().is_ok_and(|a| a.has_vision()) {
            return Ok((None, Vec::new()));
        }
        if !stage.is_first() {
            let shapes = Vision::param_shapes(cfg).map_err(MegatronError::Config)?;
            return Ok((None, shapes));
        }
        let vision = Vision::from_config(cfg, &vs.root(), None).map_err(MegatronError::Config)?;
        let mut shapes: Vec<(String, Vec<i64>)> = vs
            .variables()
            .into_iter()
            .filter(|(n, _)| n.starts_with("visual."))
            .map(|(n, t)| (n, t.size()))
            .collect();
        shapes.sort();
        Ok((vision, shapes))
    }

    /// Names and full shapes of the parameters `stage` holds, as [`full_shapes`] with the
    /// vision tower on the first stage.
    pub fn stage_shapes(&self, stage: &Stage) -> Vec<(String, Vec<i64>)> {
        let mut out = full_shapes(&self.config, self.head_kind, stage);
        if stage.is_first() {
            out.extend(self.tower_shapes.iter().cloned());
        }
        out
    }

    /// True for a vision-language model (the first stage holds its tower).
    pub fn has_vision(&self) -> bool {
        !self.tower_shapes.is_empty()
    }

    /// The DeepStack levels this stage receives from the previous one: the tower's features
    /// for the layers from this stage's first on (the first stage computes them all).
    fn deepstack_into(&self) -> usize {
        if self.stage.is_first() {
            0
        } else {
            self.deepstack_levels
                .saturating_sub(self.stage.layers.start)
        }
    }

    /// The DeepStack levels this stage passes on, for the layers past its own.
    fn deepstack_onward(&self) -> usize {
        if self.stage.is_last() {
            0
        } else {
            self.deepstack_levels.saturating_sub(self.stage.layers.end)
        }
    }

    /// The width of the activations this stage receives: the hidden states, then each
    /// DeepStack level that is still to be added, `hidden` wide each (a Qwen3-VL split whose
    /// DeepStack layers reach past the first stage).
    pub fn activation_width(&self) -> i64 {
        self.config.hidden_size * (1 + self.deepstack_into() as i64)
    }

    /// The width of the activations this stage sends on (the next stage's
    /// [`ParallelModel::activation_width`]).
    pub fn output_width(&self) -> i64 {
        self.config.hidden_size * (1 + self.deepstack_onward() as i64)
    }

    /// A later stage's input split into the hidden states and the DeepStack features it
    /// carries (the first for this stage's first layer).
    fn split_received(&self, h: Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let into = self.deepstack_into() as i64;
        if into == 0 {
            return Ok((h, Vec::new()));
        }
        let width = self.config.hidden_size;
        let x = h.f_narrow(-1, 0, width)?;
        let features = (1..=into)
            .map(|k| h.f_narrow(-1, k * width, width))
            .collect::<std::result::Result<_, _>>()?;
        Ok((x, features))
    }

    /// What this stage sends on: its output, then the DeepStack levels for the layers past
    /// it (`deepstack[0]` is the level of this stage's first layer; a batch without images has
    /// none, and sends zeros, which the layers add as nothing).
    fn pass_on(&self, x: Tensor, deepstack: &[Tensor]) -> Result<Tensor> {
        let onward = self.deepstack_onward();
        if onward == 0 {
            return Ok(x);
        }
        let layers = &self.stage.layers;
        let mut parts = vec![x.shallow_clone()];
        for level in layers.end..layers.end + onward {
            parts.push(match deepstack.get(level - layers.start) {
                Some(d) => d.shallow_clone(),
                None => x.f_zeros_like()?,
            });
        }
        Ok(Tensor::f_cat(&parts, -1)?)
    }

    /// A vision-language model's vision tokens (every stage).
    pub fn mrope(&self) -> Option<&MropeTokens> {
        self.mrope.as_ref()
    }

    /// The first stage's vision part (`None` on other stages and for text models).
    pub fn vision(&self) -> Option<&Vision> {
        self.vision.as_ref()
    }

    pub fn tp(&self) -> Option<&ProcessGroup> {
        self.tp.as_ref()
    }

    /// How parameter `name` is split over the tensor-parallel group on this rank (the
    /// model's [`crate::model::tensor_parallel::shard_spec`], except whole experts under expert
    /// tensor parallelism 1, which are not split).
    pub fn shard_spec(&self, name: &str) -> ShardSpec {
        if !self.experts_split_over_tp && is_routed_expert_param(name) {
            return ShardSpec::Replicated;
        }
        shard_spec(&self.config, name)
    }

    /// Whether the routed experts are split over the tensor-parallel group (see
    /// [`ExpertPlacement::split_over_tp`]).
    pub fn experts_split_over_tp(&self) -> bool {
        self.experts_split_over_tp
    }

    /// Splits each sequence over the context-parallel group `cp` (see [`super::context`]).
    pub fn set_context_parallel(&mut self, cp: Option<ContextParallel>) {
        self.cp = cp;
    }

    /// Adds the router's load-balancing and z-losses (Megatron's `aux_loss` load balancing
    /// with `moe_aux_loss_coeff`, `moe_z_loss_coeff`) to the gradient of training passes, and
    /// computes router logits in fp32 when `fp32_router` (`moe_router_dtype: fp32`).
    pub fn set_router(&mut self, coeffs: RouterLossCoeffs, fp32_router: bool) {
        self.router = coeffs.any().then_some(coeffs);
        for layer in &mut self.layers {
            if let Some(moe) = layer.sparse_moe_mut() {
                moe.set_fp32_router(fp32_router);
            }
        }
    }

    /// Whether training passes add router losses ([`ParallelModel::set_router`]).
    pub fn router_losses(&self) -> Option<RouterLossCoeffs> {
        self.router
    }

    pub fn context_parallel(&self) -> Option<&ContextParallel> {
        self.cp.as_ref()
    }

    /// How many positions a stage's input and output hold per position of the sequence:
    /// the sequence is split over the TP group (sequence parallelism) and the CP group.
    pub fn sequence_parts(&self) -> i64 {
        let tp = if self.sequence_parallel {
            self.tp.as_ref().map_or(1, ProcessGroup::size)
        } else {
            1
        };
        (tp * self.cp.as_ref().map_or(1, ContextParallel::size)) as i64
    }

    /// What a micro-batch's length must be a multiple of: the TP size under sequence
    /// parallelism, times two chunks per rank under context parallelism.
    pub fn sequence_granule(&self) -> i64 {
        let tp = if self.sequence_parallel {
            self.tp.as_ref().map_or(1, ProcessGroup::size) as i64
        } else {
            1
        };
        tp * self.cp.as_ref().map_or(1, ContextParallel::granule)
    }

    /// Whether the sequence is split over the TP group between the tensor-parallel layers
    /// (stage inputs and outputs then hold `T / tp` positions; `T` must divide).
    pub fn sequence_parallel(&self) -> bool {
        self.sequence_parallel
    }

    pub fn partition(&self) -> &VocabPartition {
        &self.partition
    }

    pub fn kind(&self) -> Kind {
        self.names.first().map_or(Kind::Float, |(_, t)| t.kind())
    }

    pub fn device(&self) -> tch::Device {
        self.names
            .first()
            .map_or(tch::Device::Cpu, |(_, t)| t.device())
    }

    /// Every variable of this rank with how it is distributed, in model order.
    pub fn params(&self) -> Vec<ParamInfo> {
        let tied_pp = self.config.tie_word_embeddings
            && self.stage.size > 1
            && self.head_kind == HeadKind::CausalLm;
        let tp_active = self.tp.as_ref().is_some_and(|g| g.size() > 1);
        let partial = |name: &str| {
            let g = tp_gradient(name);
            // The tower's gradients are whole already (the embeddings' split backward gathers
            // theirs). Whole experts every tensor rank holds see that rank's share of the
            // tokens (`SparseMoe::try_share`); under expert parallelism the ranks that hold
            // the same experts sum them instead (the engine's expert-DP reduction).
            let replicated_whole_expert =
                !self.experts_split_over_tp && !self.expert_parallel && g.routed_expert;
            tp_active
                && !g.vision_tower
                && (g.per_head
                    || g.router
                    || replicated_whole_expert
                    || (self.sequence_parallel && g.on_sequence_chunks))
        };
        let differs_over_tp = |name: &str| {
            tp_active
                && !self.experts_split_over_tp
                && self.expert_parallel
                && is_routed_expert_param(name)
        };
        self.names
            .iter()
            .map(|(name, t)| {
                let is_embed = name == "model.embed_tokens.weight";
                let spec = self.shard_spec(name);
                ParamInfo {
                    name: name.clone(),
                    tensor: t.shallow_clone(),
                    tensor_parallel: spec != ShardSpec::Replicated,
                    shared_embedding: tied_pp && is_embed,
                    output_copy: tied_pp && is_embed && !self.stage.is_first(),
                    is_embedding_or_output: is_embed || name == "lm_head.weight",
                    grad_partial_over_tp: partial(name),
                    differs_over_tp: differs_over_tp(name),
                }
            })
            .collect()
    }

    /// Runs this stage on a micro-batch: hidden states (B, T, hidden), after the final norm
    /// on the last stage (on a stage that passes DeepStack levels on, those follow the hidden
    /// states in the last dimension: [`ParallelModel::activation_width`]). `attention_mask`
    /// (B, T) marks real tokens. Under sequence parallelism the stage's input and output hold
    /// this rank's `T / tp` positions, except the last stage's output, which is gathered back
    /// to all `T`.
    pub fn forward_stage(
        &self,
        tape: &mut Tape,
        input: StageInput<'_>,
        position_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (tp, sp, cp) = (self.tp.as_ref(), self.sequence_parallel, self.cp.as_ref());
        let mut deepstack = Vec::new();
        let input = match input {
            StageInput::Multimodal(ids, images) => {
                let embeds = self.embed_images(tape, ids, images)?;
                deepstack = embeds.deepstack;
                StageInput::Hidden(embeds.x)
            }
            input => input,
        };
        // Under context parallelism the stage runs on this rank's positions (the hidden
        // states between stages hold only those already).
        let local_ids;
        let input = match (input, cp) {
            (StageInput::Ids(ids), Some(cp)) => {
                local_ids = cp.local(ids, 1)?;
                StageInput::Ids(&local_ids)
            }
            (input, _) => input,
        };
        // `deepstack[i]` goes into this stage's layer `i`: the first stage computes every level
        // from layer 0, a later one receives those from its first layer on.
        let mut x = match (input, &self.embed) {
            (StageInput::Ids(ids), Some(embed)) if sp => embed
                .forward_sequence_parallel(tape, ids, tp, SEQ_DIM)
                .map_err(tp_err)?,
            (StageInput::Ids(ids), Some(embed)) => embed.forward(ids, tp).map_err(tp_err)?,
            (StageInput::Hidden(h), None) => {
                let (x, features) = self.split_received(h)?;
                deepstack = features;
                x
            }
            // A vision-language first stage's embeddings, in this rank's share.
            (StageInput::Hidden(h), Some(_)) if self.vision.is_some() => {
                let local = |t: Tensor, tape: &mut Tape| -> Result<Tensor> {
                    let t = match cp {
                        Some(cp) => cp.local(&t, 1)?,
                        None => t,
                    };
                    Ok(if sp {
                        scatter_to_sequence_parallel_region(tape, &t, tp, SEQ_DIM)?
                    } else {
                        t
                    })
                };
                deepstack = std::mem::take(&mut deepstack)
                    .into_iter()
                    .map(|d| local(d, tape))
                    .collect::<Result<_>>()?;
                local(h, tape)?
            }
            (StageInput::Ids(_) | StageInput::Multimodal(..), None) => {
                return Err(MegatronError::Config(format!(
                    "stage {} has no embedding; it takes hidden states",
                    self.stage.rank
                )));
            }
            (StageInput::Hidden(_) | StageInput::Multimodal(..), Some(_)) => {
                return Err(MegatronError::Config(
                    "the first stage takes token ids".into(),
                ));
            }
        };
        // Positions, the attention mask, and this rank's real tokens (what the router's
        // losses count).
        let (positions, mask, valid) = match cp {
            None => {
                let t = position_ids.size().get(1).copied().unwrap_or(0);
                let mask = attention_mask.map(|m| causal_padding_mask(m, 0, t));
                let valid = attention_mask.map(Tensor::shallow_clone);
                (position_ids.shallow_clone(), mask, valid)
            }
            Some(cp) => {
                let valid = match attention_mask {
                    Some(m) => m.shallow_clone(),
                    None => position_ids.f_ones_like()?,
                };
                (
                    cp.local(position_ids, 1)?,
                    Some(cp.attention_mask(&valid)?),
                    Some(cp.local(&valid, 1)?),
                )
            }
        };
        let (cos, sin) = self.rotary.cos_sin(&positions, x.kind());
        let mut regions = TrainingRegions {
            tape: &mut *tape,
            tp,
            sequence_parallel: sp,
            cp,
            router: self.router,
        };
        for (slot, layer) in self.layers.iter().enumerate() {
            let masks = (mask.as_ref(), valid.as_ref());
            x = layer
                .forward_in(&mut regions, &x, &cos, &sin, masks, None)
                .map_err(tp_err)?;
            x = with_deepstack(x, &deepstack, slot);
        }
        let Some(norm) = &self.norm else {
            return self.pass_on(x, &deepstack);
        };
        let x = norm.forward(&x);
        if !sp {
            return Ok(x);
        }
        // The heads need every position. The vocab-parallel output layer's input gradient is
        // partial on each rank (reduce-scatter backward); the replicated value head's is
        // already whole (the local chunk backward).
        Ok(match self.head_kind {
            HeadKind::CausalLm => gather_from_sequence_parallel_region(tape, &x, tp, SEQ_DIM)?,
            HeadKind::Value => gather_from_sequence_parallel_region_split_grad(&x, tp, SEQ_DIM)?,
        })
    }

    /// The first stage's input embeddings of `ids` `(B, T)` with the tower's embeddings of
    /// `images` in their placeholders, and the DeepStack features, all over the whole
    /// sequence. The tower runs whole on every tensor-parallel (and context-parallel) rank;
    /// its outputs are cut once from the graph, so that the one backward through the tower
    /// takes the embeddings' and every DeepStack level's gradients together.
    fn embed_images(
        &self,
        tape: &mut Tape,
        ids: &Tensor,
        images: StageImages<'_>,
    ) -> Result<InputEmbeds> {
        let (Some(embed), Some(vision)) = (&self.embed, &self.vision) else {
            return Err(MegatronError::Config(format!(
                "stage {} has no vision tower; images go to the first stage",
                self.stage.rank
            )));
        };
        let x = embed.forward(ids, self.tp.as_ref()).map_err(tp_err)?;
        let vision_err = |e: crate::model::vision::qwen2_5_vl::VisionError| {
            MegatronError::Config(format!("vision inputs: {e}"))
        };
        let out = if images.grids.is_empty() {
            None
        } else {
            let out = vision
                .tower
                .forward(images.pixels, images.grids)
                .map_err(vision_err)?;
            let n = out.embeds.size()[0];
            let parts: Vec<&Tensor> = std::iter::once(&out.embeds)
                .chain(out.deepstack.iter())
                .collect();
            let all = tape.cut(&Tensor::f_cat(&parts, 0)?);
            let level = |k: i64| all.f_narrow(0, k * n, n);
            Some(crate::model::vision::qwen3_vl::TowerOutput {
                embeds: level(0)?,
                deepstack: (1..parts.len() as i64)
                    .map(level)
                    .collect::<std::result::Result<_, _>>()?,
            })
        };
        vision
            .place(
                x,
                ids,
                images.prompt_width,
                out,
                images.grids,
                images.videos,
            )
            .map_err(vision_err)
    }

    /// The vocab-parallel output layer: the untied `lm_head`, the last stage's copy of a tied
    /// embedding, or the embedding itself on a single stage. `what` names the caller's output
    /// in the error for stages without it (or a value head).
    fn output_layer(&self, what: &str) -> Result<&VocabParallelEmbedding> {
        match (&self.output, &self.embed) {
            (Some(o), _) => Ok(o),
            (None, Some(e)) if self.head_kind == HeadKind::CausalLm && self.stage.is_last() => {
                Ok(e)
            }
            _ => Err(MegatronError::Config(format!(
                "{what} need the causal-LM head of the last stage"
            ))),
        }
    }

    /// Log-probs (and the asked statistics) of `labels` (B, R) from final hidden states (B, R, hidden),
    /// divided by `temperature` first: the vocab-parallel head (last stage, causal LM).
    #[allow(clippy::too_many_arguments)]
    pub fn log_probs(
        &self,
        tape: &mut Tape,
        hidden: &Tensor,
        labels: &Tensor,
        temperature: f64,
        stats: TokenStats,
        topk: TopK,
        targets: Option<&TopKTargets>,
    ) -> Result<VocabParallelOutput> {
        let out = self.output_layer("log-probs")?;
        let tp = self.tp.as_ref();
        // Under sequence parallelism the hidden states were gathered with the reduction of
        // their gradient already (see `forward_stage`).
        let h = if self.sequence_parallel {
            hidden.shallow_clone()
        } else {
            copy_to_tp_region(tape, hidden, tp)
        };
        // A cap is elementwise: each rank caps its own vocabulary columns.
        let mut logits = soft_cap(out.logits(&h), self.config.final_logit_softcap());
        if temperature != 1.0 {
            logits /= temperature;
        }
        vocab_parallel_log_probs(&logits, labels, &self.partition, tp, stats, topk, targets)
            .map_err(tp_err)
    }

    /// Log-probs of the tokens `ids[:, from + 1 .. from + 1 + len]` from the last stage's final
    /// hidden states (see [`forward_stage`](Self::forward_stage)) at positions
    /// `[from, from + len)`: (B, len). `ids` (B, T) are the micro-batch's tokens; the hidden
    /// states may carry right padding, and under context parallelism hold this rank's
    /// positions only (the log-probs of all of them are computed and gathered; see
    /// [`super::context`]). `targets` (B, len, K): the teacher's top-k at those positions.
    #[allow(clippy::too_many_arguments)]
    pub fn next_token_log_probs(
        &self,
        tape: &mut Tape,
        hidden: &Tensor,
        ids: &Tensor,
        (from, len): (i64, i64),
        temperature: f64,
        stats: TokenStats,
        (topk, targets): (TopK, Option<&TopKTargets>),
    ) -> Result<VocabParallelOutput> {
        let Some(cp) = &self.cp else {
            let labels = ids.f_narrow(1, from + 1, len)?;
            let h = hidden.f_narrow(1, from, len)?;
            return self.log_probs(tape, &h, &labels, temperature, stats, topk, targets);
        };
        let size = ids.size();
        let (rows, t) = (size[0], size.get(1).copied().unwrap_or(0));
        let padded = hidden.size().get(1).copied().unwrap_or(0) * cp.size() as i64;
        // Position i's label is token i + 1; past the last token (cut off below) a zero.
        let fill = Tensor::f_zeros([rows, padded - t + 1], (ids.kind(), ids.device()))?;
        let labels = Tensor::f_cat(&[ids.f_narrow(1, 1, t - 1)?, fill], 1)?;
        // The teacher's lists placed at their positions of the padded sequence, then split
        // like the labels.
        let targets = match targets {
            Some(tg) => {
                let place = |x: &Tensor| -> Result<Tensor> {
                    let k = x.size().last().copied().unwrap_or(0);
                    let before = Tensor::f_zeros([rows, from, k], (x.kind(), x.device()))?;
                    let after =
                        Tensor::f_zeros([rows, padded - from - len, k], (x.kind(), x.device()))?;
                    Ok(cp.local(&Tensor::f_cat(&[&before, x, &after], 1)?, 1)?)
                };
                Some(TopKTargets {
                    ids: place(&tg.ids)?,
                    log_probs: place(&tg.log_probs)?,
                })
            }
            None => None,
        };
        let out = self.log_probs(
            tape,
            hidden,
            &cp.local(&labels, 1)?,
            temperature,
            stats,
            topk,
            targets.as_ref(),
        )?;
        let whole = |x: Tensor| -> Result<Tensor> { Ok(cp.gather(&x, 1)?.f_narrow(1, from, len)?) };
        Ok(VocabParallelOutput {
            log_probs: whole(out.log_probs)?,
            entropy: out.entropy.map(whole).transpose()?,
            sum_pi_squared: out.sum_pi_squared.map(whole).transpose()?,
            topk: out.topk.map(whole).transpose()?,
        })
    }

    /// Values (B, len) in f32 at positions `[from, from + len)` of the last stage's final
    /// hidden states (under context parallelism computed on this rank's positions and
    /// gathered; see [`next_token_log_probs`](Self::next_token_log_probs)).
    pub fn values_at(&self, hidden: &Tensor, (from, len): (i64, i64)) -> Result<Tensor> {
        match &self.cp {
            None => self.values(&hidden.f_narrow(1, from, len)?),
            Some(cp) => Ok(cp
                .gather(&self.values(hidden)?, 1)?
                .f_narrow(1, from, len)?),
        }
    }

    /// Values (B, R) in f32 from final hidden states (last stage, value head).
    pub fn values(&self, hidden: &Tensor) -> Result<Tensor> {
        let score = self.score.as_ref().ok_or_else(|| {
            MegatronError::Config("values need the value head of the last stage".into())
        })?;
        Ok(score.forward(hidden).squeeze_dim(-1).to_kind(Kind::Float))
    }
}

/// Incremental decoding: what the hybrid engine's rollout runs on a Megatron rank, so
/// generation never needs the full model on one rank. The layers run as in training
/// (column-split in, row-split out with an all-reduce over the TP group), without a tape and
/// without sequence parallelism (a decoding step has one position). The last stage's
/// next-token logits are the vocab-parallel output layer's local columns all-gathered over the
/// TP group, so every TP rank holds the same full row and chooses the same token from the same
/// uniform number.
impl ParallelModel {
    /// A KV cache for this stage's layers and this rank's key/value heads (with the
    /// recurrent and convolution state of its linear-attention layers).
    pub fn decode_cache(&self, rows: i64, capacity: i64, kind: Kind, device: Device) -> KvCache {
        let (_, tp) = rank_size(self.tp.as_ref());
        KvCache::for_layers(
            &self.config,
            self.stage.layers.clone(),
            (rows, tp, capacity),
            kind,
            device,
        )
    }

    /// Runs this stage on `input` (token ids (B, T) on the first stage, the previous stage's
    /// hidden states on the others) at `position_ids` (B, T), appending to `cache`.
    /// `attention_mask` (B, past + T) marks real tokens, the cached ones included. Returns
    /// hidden states (B, T, hidden), after the final norm on the last stage (and the DeepStack
    /// levels it passes on, as [`ParallelModel::forward_stage`]).
    pub fn decode_stage(
        &self,
        input: StageInput<'_>,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let tp = self.tp.as_ref();
        let mut deepstack = Vec::new();
        let mut x = match (input, &self.embed) {
            (StageInput::Ids(ids), Some(embed)) => embed.forward(ids, tp).map_err(tp_err)?,
            (StageInput::Multimodal(ids, images), Some(_)) => {
                let embeds = self.embed_images(&mut Tape::new(), ids, images)?;
                deepstack = embeds.deepstack;
                embeds.x
            }
            (StageInput::Hidden(h), None) => {
                let (x, features) = self.split_received(h)?;
                deepstack = features;
                x
            }
            (StageInput::Ids(_) | StageInput::Multimodal(..), None)
            | (StageInput::Hidden(_), Some(_)) => {
                return Err(MegatronError::Config(format!(
                    "decoding: stage {} got the wrong kind of input",
                    self.stage.rank
                )));
            }
        };
        let t = position_ids.size().get(1).copied().unwrap_or(0);
        let past = cache.len();
        let (cos, sin) = self.rotary.cos_sin(position_ids, x.kind());
        let mask = causal_padding_mask(attention_mask, past, t);
        // The new tokens' real ones: a linear-attention layer keeps padding out of its state.
        let valid = attention_mask.f_narrow(1, past, t)?;
        let mut regions = InferenceRegions { tp };
        for (slot, layer) in self.layers.iter().enumerate() {
            x = layer
                .forward_in(
                    &mut regions,
                    &x,
                    &cos,
                    &sin,
                    (Some(&mask), Some(&valid)),
                    Some(&mut *cache),
                )
                .map_err(tp_err)?;
            x = with_deepstack(x, &deepstack, slot);
        }
        cache.advance(t);
        match &self.norm {
            Some(norm) => Ok(norm.forward(&x)),
            None => self.pass_on(x, &deepstack),
        }
    }

    /// Next-token logits (rows, vocab) of final hidden states (rows, hidden): the local
    /// vocabulary columns gathered over the TP group (the same on every TP rank).
    pub fn next_token_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let local = soft_cap(
            self.output_layer("next-token logits")?.logits(hidden),
            self.config.final_logit_softcap(),
        );
        let Some(tp) = self.tp.as_ref().filter(|g| g.size() > 1) else {
            return Ok(local.f_narrow(1, 0, self.partition.vocab)?);
        };
        let rows = local.size()[0];
        let per_rank = self.partition.per_rank;
        let gathered = Tensor::f_empty(
            [tp.size() as i64, rows, per_rank],
            (local.kind(), local.device()),
        )?;
        tp.all_gather_into(&gathered, &local.f_contiguous()?)?;
        // (tp, rows, per_rank) -> (rows, tp * per_rank): rank r's columns are token ids
        // [r * per_rank, (r + 1) * per_rank); the padding columns sit past the vocabulary.
        Ok(gathered
            .f_permute([1, 0, 2])?
            .f_reshape([rows, -1])?
            .f_narrow(1, 0, self.partition.vocab)?)
    }
}
