//! The Llama / Qwen2 / Qwen3 decoder of [`crate::model`] under tensor and pipeline
//! parallelism (Megatron's `GPTModel` on `TransformerBlock`), with the same variable names as
//! the Hugging Face checkpoint so sharded loading and export need no renaming table.
//!
//! - Tensor parallelism: q/k/v and gate/up are column-parallel (heads and the intermediate
//!   size split), o and down row-parallel; the embedding and the output layer are split by
//!   vocabulary ([`VocabParallelEmbedding`]), and the log-probs come from
//!   [`vocab_parallel_log_probs`]. Norms and row-parallel biases are replicated.
//! - Pipeline parallelism: stage `s` of `pp` holds a contiguous range of layers
//!   ([`Stage`]); the first stage also holds the embedding, the last the final norm and the
//!   head. With tied embeddings and several stages the last stage holds its own copy of the
//!   embedding (`model.embed_tokens.weight` again, Megatron's `shared_embedding`), kept equal
//!   to the first stage's by summing their gradients over the embedding group.
//!
//! A forward runs on one stage and records its cuts on a [`Tape`] (see
//! [`crate::dist::mappings`]): under tensor parallelism each layer is four segments.
use std::ops::Range;

use tch::nn::{Path, VarStore};
use tch::{Kind, Tensor};

use crate::dist::ProcessGroup;
use crate::dist::mappings::{
    Tape, copy_to_tp_region, gather_from_sequence_parallel_region,
    gather_from_sequence_parallel_region_split_grad,
};
use crate::model::ModelConfig;
use crate::model::cache::causal_padding_mask;
use crate::model::decoder::{Linear, RmsNorm};
use crate::model::rope::RotaryEmbedding;
use crate::tp::{
    ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, VocabParallelOutput,
    VocabPartition, divide, rank_size, vocab_parallel_log_probs,
};

use super::{MegatronError, Result};

mod decode;

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
}

fn tp_err(e: crate::tp::TpError) -> MegatronError {
    MegatronError::Tp(e)
}

/// Grouped-query attention with local heads: q/k/v column-parallel, o row-parallel.
#[derive(Debug)]
struct ParallelAttention {
    q_proj: ColumnParallelLinear,
    k_proj: ColumnParallelLinear,
    v_proj: ColumnParallelLinear,
    o_proj: RowParallelLinear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl ParallelAttention {
    fn new(cfg: &ModelConfig, p: Path, tp: i64) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let heads = divide(cfg.num_attention_heads, tp, "num_attention_heads").map_err(tp_err)?;
        let kv_heads = divide(cfg.kv_heads(), tp, "num_key_value_heads").map_err(tp_err)?;
        let (q, kv) = (cfg.num_attention_heads * hd, cfg.kv_heads() * hd);
        let norm = |name: &str| {
            cfg.qk_norm()
                .then(|| RmsNorm::new(&p / name, hd, cfg.rms_norm_eps))
        };
        Ok(ParallelAttention {
            q_proj: ColumnParallelLinear::new(&p / "q_proj", h, q, cfg.qkv_bias(), tp)
                .map_err(tp_err)?,
            k_proj: ColumnParallelLinear::new(&p / "k_proj", h, kv, cfg.qkv_bias(), tp)
                .map_err(tp_err)?,
            v_proj: ColumnParallelLinear::new(&p / "v_proj", h, kv, cfg.qkv_bias(), tp)
                .map_err(tp_err)?,
            o_proj: RowParallelLinear::new(&p / "o_proj", q, h, cfg.o_bias(), tp)
                .map_err(tp_err)?,
            q_norm: norm("q_norm"),
            k_norm: norm("k_norm"),
            heads,
            kv_heads,
            head_dim: hd,
        })
    }

    /// `x` replicated over TP (after `f`, or gathered over the sequence); returns the input of
    /// `o_proj` (this rank's heads).
    fn core(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, mask: Option<&Tensor>) -> Tensor {
        let [q, k, v] = self.heads_qkv(x, cos, sin);
        self.attend(&q, &k, &v, mask)
    }

    /// Attention of query heads `q` (B, heads, T, D) over `k`, `v` (B, kv_heads, S, D);
    /// `mask` (B, 1, T, S) or `None` for plain causal attention (S = T). Returns (B, T,
    /// heads * D), the input of `o_proj`.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Tensor {
        let (b, t) = (q.size()[0], q.size()[2]);
        let causal = mask.is_none() && t > 1;
        let gqa = self.heads != self.kv_heads;
        let y = Tensor::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, None, gqa);
        y.transpose(1, 2)
            .reshape([b, t, self.heads * self.head_dim])
    }
}

/// SwiGLU with gate/up column-parallel and down row-parallel.
#[derive(Debug)]
struct ParallelMlp {
    gate_proj: ColumnParallelLinear,
    up_proj: ColumnParallelLinear,
    down_proj: RowParallelLinear,
}

impl ParallelMlp {
    fn new(cfg: &ModelConfig, p: Path, tp: i64) -> Result<Self> {
        let (h, i, b) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        Ok(ParallelMlp {
            gate_proj: ColumnParallelLinear::new(&p / "gate_proj", h, i, b, tp).map_err(tp_err)?,
            up_proj: ColumnParallelLinear::new(&p / "up_proj", h, i, b, tp).map_err(tp_err)?,
            down_proj: RowParallelLinear::new(&p / "down_proj", i, h, b, tp).map_err(tp_err)?,
        })
    }

    /// The input of `down_proj` (this rank's part of the intermediate size).
    fn core(&self, x: &Tensor) -> Tensor {
        self.gate_proj.forward(x).silu() * self.up_proj.forward(x)
    }
}

#[derive(Debug)]
struct ParallelDecoderLayer {
    self_attn: ParallelAttention,
    mlp: ParallelMlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl ParallelDecoderLayer {
    fn new(cfg: &ModelConfig, p: Path, tp: i64) -> Result<Self> {
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(ParallelDecoderLayer {
            self_attn: ParallelAttention::new(cfg, &p / "self_attn", tp)?,
            mlp: ParallelMlp::new(cfg, &p / "mlp", tp)?,
            input_layernorm: RmsNorm::new(&p / "input_layernorm", h, eps),
            post_attention_layernorm: RmsNorm::new(&p / "post_attention_layernorm", h, eps),
        })
    }

    /// Four segments under TP: `norm -> f`, `attention -> g -> +residual`, `norm -> f`,
    /// `mlp -> g -> +residual`, with the residual stream cut between them. Under sequence
    /// parallelism the residual stream holds this rank's chunk of the sequence, `f` becomes an
    /// all-gather of the sequence and `g` a reduce-scatter.
    fn forward(
        &self,
        tape: &mut Tape,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        par: Par<'_>,
    ) -> Result<Tensor> {
        let h0 = par.cut(tape, x);
        let a = par.enter(tape, &self.input_layernorm.forward(&h0))?;
        let attn = par.exit(
            tape,
            &self.self_attn.o_proj,
            &self.self_attn.core(&a, cos, sin, mask),
        )?;
        let h1 = par.cut(tape, &(&h0 + attn));
        let m = par.enter(tape, &self.post_attention_layernorm.forward(&h1))?;
        Ok(&h1 + par.exit(tape, &self.mlp.down_proj, &self.mlp.core(&m))?)
    }
}

/// The tensor-parallel group of a forward and whether the sequence is split over it.
#[derive(Debug, Clone, Copy)]
struct Par<'a> {
    tp: Option<&'a ProcessGroup>,
    sp: bool,
}

/// Sequence dim of hidden states (B, T, hidden).
const SEQ_DIM: i64 = 1;

impl Par<'_> {
    fn cut(&self, tape: &mut Tape, t: &Tensor) -> Tensor {
        if self.tp.is_some() {
            tape.cut(t)
        } else {
            t.shallow_clone()
        }
    }

    /// Into a column-parallel layer: `f`, or the sequence all-gather.
    fn enter(&self, tape: &mut Tape, x: &Tensor) -> Result<Tensor> {
        if self.sp {
            Ok(gather_from_sequence_parallel_region(
                tape, x, self.tp, SEQ_DIM,
            )?)
        } else {
            Ok(copy_to_tp_region(tape, x, self.tp))
        }
    }

    /// Out of a row-parallel layer: `g`, or the sequence reduce-scatter.
    fn exit(&self, tape: &mut Tape, row: &RowParallelLinear, x: &Tensor) -> Result<Tensor> {
        if self.sp {
            row.forward_sequence_parallel(tape, x, self.tp, SEQ_DIM)
                .map_err(tp_err)
        } else {
            row.forward(x, self.tp).map_err(tp_err)
        }
    }
}

/// Input of a stage: token ids on the first stage, the previous stage's hidden states
/// (a [`Tape::input`] leaf) on the others.
#[derive(Debug)]
pub enum StageInput<'a> {
    Ids(&'a Tensor),
    Hidden(Tensor),
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
    partition: VocabPartition,
    embed: Option<VocabParallelEmbedding>,
    layers: Vec<ParallelDecoderLayer>,
    norm: Option<RmsNorm>,
    /// Untied `lm_head`, or the last stage's copy of a tied embedding (`None` when the
    /// embedding on this stage serves as output layer, or for a value head).
    output: Option<VocabParallelEmbedding>,
    score: Option<Linear>,
    rotary: RotaryEmbedding,
    names: Vec<(String, Tensor)>,
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
        let root = vs.root();
        cfg.validate().map_err(MegatronError::Config)?;
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
                    .map_err(tp_err)?,
            )
        } else {
            None
        };
        let layers = stage
            .layers
            .clone()
            .map(|i| ParallelDecoderLayer::new(cfg, &model / "layers" / i, tp_size))
            .collect::<Result<Vec<_>>>()?;
        let last = stage.is_last();
        let norm = last.then(|| RmsNorm::new(&model / "norm", cfg.hidden_size, cfg.rms_norm_eps));
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
        let mut names: Vec<(String, Tensor)> = Vec::new();
        let vars = vs.variables();
        // Model order: embedding, layers (HF registration order), final norm, head.
        let mut keys: Vec<&String> = vars.keys().collect();
        keys.sort_by_key(|k| param_order(k));
        for k in keys {
            if let Some(t) = vars.get(k) {
                names.push((k.clone(), t.shallow_clone()));
            }
        }
        Ok(ParallelModel {
            config: cfg.clone(),
            head_kind: head,
            stage,
            sequence_parallel: sequence_parallel && tp.as_ref().is_some_and(|g| g.size() > 1),
            tp,
            partition,
            embed,
            layers,
            norm,
            output,
            score,
            rotary,
            names,
        })
    }

    pub fn tp(&self) -> Option<&ProcessGroup> {
        self.tp.as_ref()
    }

    /// Whether the sequence is split over the TP group between the tensor-parallel layers
    /// (stage inputs and outputs then hold `T / tp` positions; `T` must divide).
    pub fn sequence_parallel(&self) -> bool {
        self.sequence_parallel
    }

    fn par(&self) -> Par<'_> {
        Par {
            tp: self.tp.as_ref(),
            sp: self.sequence_parallel,
        }
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
            let per_head = name.ends_with("q_norm.weight") || name.ends_with("k_norm.weight");
            let on_chunks = name.ends_with("layernorm.weight")
                || name == "model.norm.weight"
                || name.ends_with("o_proj.bias")
                || name.ends_with("down_proj.bias");
            tp_active && (per_head || (self.sequence_parallel && on_chunks))
        };
        self.names
            .iter()
            .map(|(name, t)| {
                let is_embed = name == "model.embed_tokens.weight";
                let spec = crate::tp::shard::hf_shard_spec(name);
                ParamInfo {
                    name: name.clone(),
                    tensor: t.shallow_clone(),
                    tensor_parallel: spec != crate::tp::ShardSpec::Replicated,
                    shared_embedding: tied_pp && is_embed,
                    output_copy: tied_pp && is_embed && !self.stage.is_first(),
                    is_embedding_or_output: is_embed || name == "lm_head.weight",
                    grad_partial_over_tp: partial(name),
                }
            })
            .collect()
    }

    /// Runs this stage on a micro-batch: hidden states (B, T, hidden), after the final norm
    /// on the last stage. `attention_mask` (B, T) marks real tokens. Under sequence
    /// parallelism the stage's input and output hold this rank's `T / tp` positions, except the
    /// last stage's output, which is gathered back to all `T`.
    pub fn forward_stage(
        &self,
        tape: &mut Tape,
        input: StageInput<'_>,
        position_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let par = self.par();
        let mut x = match (input, &self.embed) {
            (StageInput::Ids(ids), Some(embed)) if par.sp => embed
                .forward_sequence_parallel(tape, ids, par.tp, SEQ_DIM)
                .map_err(tp_err)?,
            (StageInput::Ids(ids), Some(embed)) => embed.forward(ids, par.tp).map_err(tp_err)?,
            (StageInput::Hidden(h), None) => h,
            (StageInput::Ids(_), None) => {
                return Err(MegatronError::Config(format!(
                    "stage {} has no embedding; it takes hidden states",
                    self.stage.rank
                )));
            }
            (StageInput::Hidden(_), Some(_)) => {
                return Err(MegatronError::Config(
                    "the first stage takes token ids".into(),
                ));
            }
        };
        let t = position_ids.size().get(1).copied().unwrap_or(0);
        let (cos, sin) = self.rotary.cos_sin(position_ids, x.kind());
        let mask = attention_mask.map(|m| causal_padding_mask(m, 0, t));
        for layer in &self.layers {
            x = layer.forward(tape, &x, &cos, &sin, mask.as_ref(), par)?;
        }
        let Some(norm) = &self.norm else { return Ok(x) };
        let x = norm.forward(&x);
        if !par.sp {
            return Ok(x);
        }
        // The heads need every position. The vocab-parallel output layer's input gradient is
        // partial on each rank (reduce-scatter backward); the replicated value head's is
        // already whole (the local chunk backward).
        Ok(match self.head_kind {
            HeadKind::CausalLm => gather_from_sequence_parallel_region(tape, &x, par.tp, SEQ_DIM)?,
            HeadKind::Value => {
                gather_from_sequence_parallel_region_split_grad(&x, par.tp, SEQ_DIM)?
            }
        })
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

    /// Log-probs (and entropy) of `labels` (B, R) from final hidden states (B, R, hidden),
    /// divided by `temperature` first: the vocab-parallel head (last stage, causal LM).
    pub fn log_probs(
        &self,
        tape: &mut Tape,
        hidden: &Tensor,
        labels: &Tensor,
        temperature: f64,
        with_entropy: bool,
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
        let mut logits = out.logits(&h);
        if temperature != 1.0 {
            logits /= temperature;
        }
        vocab_parallel_log_probs(&logits, labels, &self.partition, tp, with_entropy).map_err(tp_err)
    }

    /// Values (B, R) in f32 from final hidden states (last stage, value head).
    pub fn values(&self, hidden: &Tensor) -> Result<Tensor> {
        let score = self.score.as_ref().ok_or_else(|| {
            MegatronError::Config("values need the value head of the last stage".into())
        })?;
        Ok(score.forward(hidden).squeeze_dim(-1).to_kind(Kind::Float))
    }
}

/// Sort key putting variables in model order (embedding, layers by index and HF
/// registration order, final norm, head).
fn param_order(name: &str) -> (u8, usize, u8, String) {
    const LAYER_ORDER: [&str; 11] = [
        "input_layernorm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "self_attn.q_norm",
        "self_attn.k_norm",
        "post_attention_layernorm",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ];
    if let Some(rest) = name.strip_prefix("model.layers.") {
        let (i, sub) = rest.split_once('.').unwrap_or((rest, ""));
        let pos = LAYER_ORDER
            .iter()
            .position(|m| sub.starts_with(m))
            .unwrap_or(LAYER_ORDER.len());
        return (
            1,
            i.parse().unwrap_or(usize::MAX),
            pos as u8,
            sub.to_owned(),
        );
    }
    let top = match name {
        "model.embed_tokens.weight" => 0,
        n if n.starts_with("model.norm") => 2,
        _ => 3,
    };
    (top, 0, 0, name.to_owned())
}
