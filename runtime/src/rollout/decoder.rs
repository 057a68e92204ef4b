//! What the generation loop ([`super::engine`]) decodes with: a [`Decoder`] runs token ids
//! through a model with a KV cache and chooses the next tokens.
//!
//! - [`CausalLm`]: one process's whole model (single engine, FSDP's gathered weights).
//! - [`ShardedDecoder`]: one Megatron rank's shards ([`ParallelModel`]), so no rank ever holds
//!   the whole model. Tensor-parallel peers run every step together (their layers all-reduce
//!   over the TP group) and see the same gathered logits, so they choose the same tokens from
//!   the same uniform numbers. Pipeline stages run one after the other per step: each receives
//!   the previous stage's hidden states and sends its own on; the last stage chooses the tokens
//!   and broadcasts them (and their log-probs) to the other stages, so every rank's loop keeps
//!   the same rows, ends and compactions.
use tch::{Device, Kind, Tensor};

pub use crate::engine::hybrid::{RolloutLayout, ShardLayout};
use crate::engine::megatron::{ParallelModel, StageImages, StageInput};
use crate::model::vision::{ProcessedImage, Vision};
use crate::model::{CausalLm, KvCache, ModelConfig};
use crate::parallel::dist::ProcessGroup;

use super::logprob::compute_log_probs;
use super::vocab_head::{DecodeHead, HeadLogits};
use super::{RolloutError, SamplingParams};
use crate::logits::SequenceBatch;

/// A model the generation loop can decode with; see the module docs.
pub trait Decoder {
    /// Per-call state of the output layer (the CPU head's weight blocks and buffers).
    type Head;

    fn config(&self) -> &ModelConfig;
    fn device(&self) -> Device;
    /// The dtype of the weights (and so of the cache).
    fn kind(&self) -> Kind;
    fn head(&self, params: &SamplingParams) -> Self::Head;
    /// An empty cache for `rows` sequences of up to `capacity` positions.
    fn cache(&self, rows: i64, capacity: i64) -> KvCache;
    /// Runs `ids` (B, T) at `position_ids` (B, T) through the model, appending to `cache`;
    /// `attention_mask` (B, past + T) marks real tokens. Returns the next-token logits of the
    /// last position on the ranks that choose tokens, `None` on the others.
    fn next_logits(
        &self,
        head: &mut Self::Head,
        ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Option<HeadLogits>, RolloutError>;
    /// True for a vision-language model: its prompts are prefilled with
    /// [`Decoder::prefill_images`] and its positions are multimodal `(B, T, 3)`.
    fn has_vision(&self) -> bool {
        false
    }
    /// A vision-language model's prefill of a left-padded batch `ids` (B, T) whose rows hold
    /// `images` (in order): the next-token logits (as [`Decoder::next_logits`]) and the
    /// prompt's M-RoPE positions `(B, T, 3)`.
    fn prefill_images(
        &self,
        _head: &mut Self::Head,
        _ids: &Tensor,
        _attention_mask: &Tensor,
        _images: &[&ProcessedImage],
        _cache: &mut KvCache,
    ) -> Result<(Option<HeadLogits>, Tensor), RolloutError> {
        Err(RolloutError::Batch(
            "this rollout model has no vision tower: prompts with images need the whole vision-language model".into(),
        ))
    }
    /// The chosen tokens (rows,) and their log-probabilities (rows,) in f32, the same on every
    /// rank of the model; `u` (rows,) holds each row's uniform number.
    fn choose(
        &self,
        logits: Option<&HeadLogits>,
        params: &SamplingParams,
        u: &Tensor,
    ) -> Result<(Tensor, Tensor), RolloutError>;
    /// Log-probs of the `response_len` last tokens of `batch` through the training forward
    /// ([`super::LogProbPath::Recompute`]).
    fn recompute_log_probs(
        &self,
        batch: &SequenceBatch<'_>,
        response_len: i64,
        temperature: f64,
        micro_batch: usize,
    ) -> Result<Tensor, RolloutError>;
}

impl Decoder for CausalLm {
    type Head = DecodeHead;

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn device(&self) -> Device {
        CausalLm::device(self)
    }

    fn kind(&self) -> Kind {
        CausalLm::kind(self)
    }

    fn head(&self, params: &SamplingParams) -> DecodeHead {
        DecodeHead::new(self, params)
    }

    fn cache(&self, rows: i64, capacity: i64) -> KvCache {
        KvCache::new(&self.config, rows, capacity, self.kind(), self.device())
    }

    fn next_logits(
        &self,
        head: &mut DecodeHead,
        ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Option<HeadLogits>, RolloutError> {
        let t = ids.size()[1];
        let hidden = self
            .model
            .forward(ids, position_ids, Some(attention_mask), Some(cache));
        Ok(Some(
            head.logits(&hidden.f_narrow(1, t - 1, 1)?.f_squeeze_dim(1)?),
        ))
    }

    fn has_vision(&self) -> bool {
        self.vision.is_some()
    }

    fn prefill_images(
        &self,
        head: &mut DecodeHead,
        ids: &Tensor,
        attention_mask: &Tensor,
        images: &[&ProcessedImage],
        cache: &mut KvCache,
    ) -> Result<(Option<HeadLogits>, Tensor), RolloutError> {
        let vision = self.vision()?;
        // Images and videos, in order of appearance.
        let (pos, _) = vision.item_positions(ids, attention_mask, images)?;
        let t = ids.size()[1];
        let x = vision.embed(&self.model, ids, t, images)?;
        let (cos, sin) = self.model.rotary().cos_sin(&pos, x.x.kind());
        let hidden = self
            .model
            .forward_embeds(x, (&cos, &sin), Some(attention_mask), Some(cache));
        let logits = head.logits(&hidden.f_narrow(1, t - 1, 1)?.f_squeeze_dim(1)?);
        Ok((Some(logits), pos))
    }

    fn choose(
        &self,
        logits: Option<&HeadLogits>,
        params: &SamplingParams,
        u: &Tensor,
    ) -> Result<(Tensor, Tensor), RolloutError> {
        let logits =
            logits.ok_or_else(|| RolloutError::Batch("no logits to choose from".into()))?;
        Ok(logits.next_tokens(params, u))
    }

    fn recompute_log_probs(
        &self,
        batch: &SequenceBatch<'_>,
        response_len: i64,
        temperature: f64,
        micro_batch: usize,
    ) -> Result<Tensor, RolloutError> {
        Ok(
            compute_log_probs(self, batch, response_len, temperature, micro_batch, false)?
                .log_probs,
        )
    }
}

/// Decoding on one Megatron rank's shards; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct ShardedDecoder<'a> {
    pub model: &'a ParallelModel,
    /// The pipeline group (`None` or one rank: a single stage).
    pub pp: Option<&'a ProcessGroup>,
}

/// Tag of the hidden states sent between stages while decoding.
const STAGE_TAG: u32 = 0x0DEC;

impl ShardedDecoder<'_> {
    fn pp(&self) -> Option<&ProcessGroup> {
        self.pp.filter(|g| g.size() > 1)
    }

    fn dist(e: impl std::fmt::Display) -> RolloutError {
        RolloutError::Batch(format!("sharded decoding: {e}"))
    }

    /// Runs this rank's stage on `first` (the first stage's input; the others receive the
    /// previous stage's hidden states), passing its output on; the next-token logits on the
    /// last stage.
    fn run_stage(
        &self,
        first: StageInput<'_>,
        ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Option<HeadLogits>, RolloutError> {
        let stage = &self.model.stage;
        let (b, t) = (ids.size()[0], ids.size()[1]);
        let input = match self.pp() {
            Some(pp) if !stage.is_first() => {
                let shape = [b, t, self.model.activation_width()];
                let h = Tensor::f_empty(shape, (self.kind(), self.device()))?;
                pp.recv(&h, stage.rank - 1, STAGE_TAG).map_err(Self::dist)?;
                StageInput::Hidden(h)
            }
            _ => first,
        };
        let hidden = self
            .model
            .decode_stage(input, position_ids, attention_mask, cache)
            .map_err(Self::dist)?;
        if let Some(pp) = self.pp().filter(|_| !stage.is_last()) {
            pp.send(&hidden.f_contiguous()?, stage.rank + 1, STAGE_TAG)
                .map_err(Self::dist)?;
            return Ok(None);
        }
        let last = hidden.f_narrow(1, t - 1, 1)?.f_squeeze_dim(1)?;
        let logits = self.model.next_token_logits(&last).map_err(Self::dist)?;
        Ok(Some(HeadLogits::RowMajor(logits)))
    }
}

impl Decoder for ShardedDecoder<'_> {
    type Head = ();

    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn device(&self) -> Device {
        self.model.device()
    }

    fn kind(&self) -> Kind {
        self.model.kind()
    }

    fn head(&self, _: &SamplingParams) {}

    fn cache(&self, rows: i64, capacity: i64) -> KvCache {
        self.model
            .decode_cache(rows, capacity, self.kind(), self.device())
    }

    fn next_logits(
        &self,
        _: &mut (),
        ids: &Tensor,
        position_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Option<HeadLogits>, RolloutError> {
        self.run_stage(
            StageInput::Ids(ids),
            ids,
            position_ids,
            attention_mask,
            cache,
        )
    }

    fn has_vision(&self) -> bool {
        self.model.has_vision()
    }

    /// Every stage computes the prompt's M-RoPE positions; the first embeds the images.
    fn prefill_images(
        &self,
        _: &mut (),
        ids: &Tensor,
        attention_mask: &Tensor,
        images: &[&ProcessedImage],
        cache: &mut KvCache,
    ) -> Result<(Option<HeadLogits>, Tensor), RolloutError> {
        let t = ids.size()[1];
        let (pixels, grids) = Vision::pixels(images, ids.device())?;
        let videos = Vision::video_flags(images);
        let tokens = self.model.mrope().ok_or_else(|| {
            RolloutError::Batch("prompts with images need a vision-language model".into())
        })?;
        let (pos, _) = tokens.item_positions(ids, attention_mask, images)?;
        let input = StageInput::Multimodal(
            ids,
            StageImages {
                pixels: &pixels,
                grids: &grids,
                videos: &videos,
                prompt_width: t,
            },
        );
        let logits = self.run_stage(input, ids, &pos, attention_mask, cache)?;
        Ok((logits, pos))
    }

    fn choose(
        &self,
        logits: Option<&HeadLogits>,
        params: &SamplingParams,
        u: &Tensor,
    ) -> Result<(Tensor, Tensor), RolloutError> {
        let rows = u.size()[0];
        let (tokens, logp) = match logits {
            Some(l) => {
                let (tokens, logp) = l.next_tokens(params, u);
                (tokens, logp.f_to_kind(Kind::Float)?)
            }
            None => (
                Tensor::f_zeros([rows], (Kind::Int64, u.device()))?,
                Tensor::f_zeros([rows], (Kind::Float, u.device()))?,
            ),
        };
        if let Some(pp) = self.pp() {
            let last = pp.size() - 1;
            let both = [tokens.f_contiguous()?, logp.f_contiguous()?];
            pp.broadcast_many(&both, last).map_err(Self::dist)?;
            let [tokens, logp] = both;
            return Ok((tokens, logp));
        }
        Ok((tokens, logp))
    }

    fn recompute_log_probs(
        &self,
        _: &SequenceBatch<'_>,
        _: i64,
        _: f64,
        _: usize,
    ) -> Result<Tensor, RolloutError> {
        Err(RolloutError::Params(
            "recomputing log-probs after generation needs the whole model; a sharded rollout \
             takes them while decoding (LogProbPath::Decode)"
                .into(),
        ))
    }
}
