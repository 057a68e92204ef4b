//! The vocab-parallel embedding (and tied output layer) and how a vocabulary is split.
//!
//! Column- and row-split linears are [`crate::model::layers::Linear`] with a
//! [`crate::model::layers::Split`]; the collectives around them are the
//! [`super::regions`]'. Variables are registered under the Hugging Face names with this rank's
//! shape, so a sharded load ([`super::shard`]) fills them by name.
use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

use super::Result;
use crate::model::layers::scale_embeddings;
use crate::parallel::dist::ProcessGroup;
use crate::parallel::mappings::{
    Tape, reduce_from_tp_region, reduce_scatter_to_sequence_parallel_region,
};

/// How a vocabulary of `vocab` entries is split: `padded` rows (a multiple of the group
/// size, as Megatron pads its vocabulary), `per_rank` each; rank `r` owns token ids
/// `[r * per_rank, r * per_rank + valid)`. Padding rows are never looked up and their logits
/// are dropped before any softmax, so results equal the unpadded model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VocabPartition {
    pub vocab: i64,
    pub padded: i64,
    pub per_rank: i64,
    pub rank: i64,
}

impl VocabPartition {
    pub fn new(vocab: i64, rank: i64, size: i64) -> Result<Self> {
        if vocab <= 0 || size <= 0 || rank < 0 || rank >= size {
            return Err(super::TpError::Config(format!(
                "vocab {vocab} cannot be split for rank {rank} of {size}"
            )));
        }
        let per_rank = (vocab + size - 1) / size;
        if (size - 1) * per_rank >= vocab {
            return Err(super::TpError::Config(format!(
                "a vocabulary of {vocab} leaves the last of {size} tensor-parallel ranks without tokens"
            )));
        }
        Ok(VocabPartition {
            vocab,
            padded: per_rank * size,
            per_rank,
            rank,
        })
    }

    /// First token id of this rank.
    pub fn start(&self) -> i64 {
        self.rank * self.per_rank
    }

    /// Real (non-padding) entries of this rank.
    pub fn valid(&self) -> i64 {
        (self.vocab - self.start()).clamp(0, self.per_rank)
    }
}

/// Embedding whose rows (token ids) are split over the group; each rank looks up the ids it
/// owns, zeroes the others, and the outputs are summed over the group.
#[derive(Debug)]
pub struct VocabParallelEmbedding {
    pub weight: Tensor,
    pub partition: VocabPartition,
    /// What the looked-up rows are multiplied by (a family's `sqrt(hidden_size)`; `None` for
    /// other models and for the output layer).
    pub scale: Option<f64>,
}

impl VocabParallelEmbedding {
    /// Registers `weight` (per_rank, hidden) under `p`.
    pub fn new(p: Path, partition: VocabPartition, hidden: i64) -> Result<Self> {
        let weight = p.f_var("weight", &[partition.per_rank, hidden], Init::Const(0.0))?;
        Ok(VocabParallelEmbedding {
            weight,
            partition,
            scale: None,
        })
    }

    /// The same rows scaled by `scale` when looked up (the model's embedding scale).
    pub fn scaled(mut self, scale: Option<f64>) -> Self {
        self.scale = scale;
        self
    }

    /// Embeddings (…, hidden) of token ids (…), replicated over the group.
    pub fn forward(&self, ids: &Tensor, group: Option<&ProcessGroup>) -> Result<Tensor> {
        if group.is_none_or(|g| g.size() == 1) {
            let x = Tensor::f_embedding(&self.weight, ids, -1, false, false)?;
            return Ok(scale_embeddings(x, self.scale));
        }
        Ok(reduce_from_tp_region(&self.partial(ids)?, group)?)
    }

    /// Sequence parallelism: the embeddings reduce-scattered along `seq_dim`.
    pub fn forward_sequence_parallel(
        &self,
        tape: &mut Tape,
        ids: &Tensor,
        group: Option<&ProcessGroup>,
        seq_dim: i64,
    ) -> Result<Tensor> {
        Ok(reduce_scatter_to_sequence_parallel_region(
            tape,
            &self.partial(ids)?,
            group,
            seq_dim,
        )?)
    }

    /// This rank's rows looked up, zeros for the ids it does not own (summed over the group,
    /// the embeddings).
    pub fn partial(&self, ids: &Tensor) -> Result<Tensor> {
        let start = self.partition.start();
        let outside = ids
            .f_lt(start)?
            .f_logical_or(&ids.f_ge(start + self.partition.valid())?)?;
        let local = (ids - start).f_masked_fill(&outside, 0)?;
        let out = Tensor::f_embedding(&self.weight, &local, -1, false, false)?;
        // Zeros stay zeros: scaling each rank's rows before the sum is scaling the sum.
        let out = out.f_masked_fill(&outside.f_unsqueeze(-1)?, 0.0)?;
        Ok(scale_embeddings(out, self.scale))
    }

    /// Local logits (…, per_rank) of hidden states against these rows (the tied output
    /// layer); padding columns are included (see [`super::cross_entropy`]).
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        hidden.linear::<&Tensor>(&self.weight, None)
    }

    pub fn kind(&self) -> Kind {
        self.weight.kind()
    }
}
