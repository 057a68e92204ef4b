//! Incremental decoding on one (TP rank, PP stage) of the model: what the hybrid engine's
//! rollout runs on a Megatron rank, so generation never needs the full model on one rank.
//!
//! The stage keeps a KV cache of its own layers and its own heads (kv_heads / tp per layer);
//! the layers run as in training (column-parallel in, row-parallel out with an all-reduce over
//! the TP group), without a tape and without sequence parallelism (a decoding step has one
//! position). The last stage's next-token logits are the vocab-parallel output layer's local
//! columns all-gathered over the TP group, so every TP rank holds the same full row and
//! chooses the same token from the same uniform number.
use tch::{Device, Kind, Tensor};

use crate::model::KvCache;
use crate::model::cache::causal_padding_mask;
use crate::model::decoder::RmsNorm;
use crate::model::rope::apply_rotary;
use crate::tp::{ColumnParallelLinear, rank_size};

use super::{
    MegatronError, ParallelAttention, ParallelDecoderLayer, ParallelModel, Result, StageInput,
};

impl ParallelAttention {
    /// `x` (B, T, hidden) replicated over TP; appends this rank's keys and values of layer
    /// `layer` (the cache's index) and returns the input of `o_proj`.
    fn decode(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        cache: &mut KvCache,
        layer: usize,
    ) -> Tensor {
        let [q, k, v] = self.heads_qkv(x, cos, sin);
        let (k, v) = cache.update(layer, &k, &v);
        self.attend(&q, &k, &v, mask)
    }

    /// This rank's query, key and value heads (B, n, T, head_dim), rotated.
    pub(super) fn heads_qkv(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> [Tensor; 3] {
        let (b, t) = (x.size()[0], x.size()[1]);
        let heads = |proj: &ColumnParallelLinear, n: i64, norm: &Option<RmsNorm>| {
            let y = proj.forward(x).view([b, t, n, self.head_dim]);
            let y = match norm {
                Some(norm) => norm.forward(&y),
                None => y,
            };
            y.transpose(1, 2)
        };
        [
            apply_rotary(&heads(&self.q_proj, self.heads, &self.q_norm), cos, sin),
            apply_rotary(&heads(&self.k_proj, self.kv_heads, &self.k_norm), cos, sin),
            heads(&self.v_proj, self.kv_heads, &None),
        ]
    }
}

impl ParallelDecoderLayer {
    /// `rope` is the rotary `(cos, sin)` of the positions being decoded.
    fn decode(
        &self,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        mask: Option<&Tensor>,
        cache: &mut KvCache,
        layer: usize,
        tp: Option<&crate::dist::ProcessGroup>,
    ) -> Result<Tensor> {
        let a = self.input_layernorm.forward(x);
        let core = self.self_attn.decode(&a, cos, sin, mask, cache, layer);
        let h = x + self
            .self_attn
            .o_proj
            .forward(&core, tp)
            .map_err(super::tp_err)?;
        let m = self.post_attention_layernorm.forward(&h);
        let mlp = self
            .mlp
            .down_proj
            .forward(&self.mlp.core(&m), tp)
            .map_err(super::tp_err)?;
        Ok(h + mlp)
    }
}

impl ParallelModel {
    /// A KV cache for this stage's layers and this rank's key/value heads.
    pub fn decode_cache(&self, rows: i64, capacity: i64, kind: Kind, device: Device) -> KvCache {
        let (_, tp) = rank_size(self.tp.as_ref());
        KvCache::with_dims(
            self.layers.len(),
            rows,
            self.config.kv_heads() / tp,
            capacity,
            self.config.head_dim(),
            kind,
            device,
        )
    }

    /// Runs this stage on `input` (token ids (B, T) on the first stage, the previous stage's
    /// hidden states on the others) at `position_ids` (B, T), appending to `cache`.
    /// `attention_mask` (B, past + T) marks real tokens, the cached ones included. Returns
    /// hidden states (B, T, hidden), after the final norm on the last stage.
    pub fn decode_stage(
        &self,
        input: StageInput<'_>,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let tp = self.tp.as_ref();
        let mut x = match (input, &self.embed) {
            (StageInput::Ids(ids), Some(embed)) => embed.forward(ids, tp).map_err(super::tp_err)?,
            (StageInput::Hidden(h), None) => h,
            (StageInput::Ids(_), None) | (StageInput::Hidden(_), Some(_)) => {
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
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.decode(&x, (&cos, &sin), Some(&mask), cache, i, tp)?;
        }
        cache.advance(t);
        Ok(match &self.norm {
            Some(norm) => norm.forward(&x),
            None => x,
        })
    }

    /// Next-token logits (rows, vocab) of final hidden states (rows, hidden): the local
    /// vocabulary columns gathered over the TP group (the same on every TP rank).
    pub fn next_token_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let local = self.output_layer("next-token logits")?.logits(hidden);
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
