//! What the decoder layers and the head of one micro-batch read besides their input, in the
//! three layouts the FSDP engine runs:
//! - padded: `(B, T)` rows with a padding mask; the last layer computes the head's window only
//!   ([`crate::model::decoder::Model::forward_window`]);
//! - packed (`use_remove_padding`): the valid tokens end to end, `(1, N)`, attention per
//!   sequence ([`crate::model::packed`]); the last layer computes the window's tokens only;
//! - Ulysses (`ulysses_sequence_parallel_size`, packed): the packed tokens split in equal
//!   shards over the sequence-parallel group; around attention an all-to-all trades the
//!   sequence shard for a shard of the heads over the whole sequence and back (DeepSpeed
//!   Ulysses). The head computes its per-token outputs on each rank's own window tokens and
//!   all ranks gather them, so every rank's loss is the same function of the same numbers.

use tch::Tensor;

use crate::engine::topk_targets;
use crate::logits::topk::TopKTargets;
use crate::model::cache::{causal_padding_mask, causal_window_mask};
use crate::model::decoder::{Attention, DecoderLayer, Model, TokenLayout, with_deepstack};
use crate::model::eager_attention::AttentionVariant;
use crate::model::gated_deltanet::{GatedDeltaNet, HeadSlice, Projected};
use crate::model::packed::{AttentionSpan, PackedWindow, Packing, attend_spans};
use crate::model::vision::InputEmbeds;
use crate::parallel::dist::ProcessGroup;

use super::head::{self, FsdpHead};
use super::{Batch, EngineError, ForwardOptions, FsdpError, Result};

/// A micro-batch's per-layer inputs (see the module docs).
pub(super) struct LayerInputs {
    /// The token ids the embedding reads: `(B, T)`, packed `(1, N)` or this rank's shard.
    ids: Tensor,
    /// Where the valid tokens of the padded batch go when packed (a vision-language model's
    /// input embeddings are computed padded, then packed the same way).
    packing: Option<Packing>,
    cos: Tensor,
    sin: Tensor,
    layout: Layout,
    /// What the first layers' outputs add (Qwen3-VL's DeepStack features), laid out as the
    /// tokens are.
    deepstack: Vec<Tensor>,
}

enum Layout {
    Padded {
        mask: Tensor,
        /// `(B, T)` real tokens (linear-attention layers zero the rest).
        valid: Tensor,
        /// The window `[start, start+len)` and the last layer's attention mask for it.
        window_start: i64,
        window_len: i64,
        window_mask: Tensor,
    },
    Packed {
        spans: Vec<AttentionSpan>,
        window: PackedWindow,
    },
    Ulysses {
        spans: Vec<AttentionSpan>,
        window: PackedWindow,
        shard: SequenceShard,
        /// Packed tokens per rank (the last rank's shard padded to it).
        per: i64,
    },
}

/// This rank's share of the packed sequence under Ulysses.
struct SequenceShard {
    group: ProcessGroup,
    /// This rank's window tokens among the window's: (first, count).
    mine: (i64, i64),
    /// This rank's window tokens, as indices into its shard.
    local_window: Tensor,
    /// Window tokens on the rank that has the most (each rank pads its own to this many).
    per_rank: i64,
    /// `(M,)` the window tokens' rows in the gathered `(size * per_rank)` outputs.
    pick: Tensor,
}

impl LayerInputs {
    /// The embedding `(…, hidden)` of a micro-batch and its layer inputs; `packed` runs it
    /// without padding, `sp` (packed only) splits the sequence over a Ulysses group.
    /// `embeds`: the micro-batch's input embeddings `(B, T, hidden)` when they are more than
    /// the token embeddings (a vision-language model's, [`super::Head::input_embeds`]).
    pub(super) fn new(
        model: &Model,
        mb: &Batch,
        packed: bool,
        sp: Option<&ProcessGroup>,
        embeds: Option<InputEmbeds>,
    ) -> Result<(Tensor, Self)> {
        let ids = mb.get("input_ids")?;
        let pos = mb.get("position_ids")?;
        let key_valid = mb.get("attention_mask")?;
        let t = ids.size().get(1).copied().unwrap_or(0);
        let (start, r) = head::window(mb)?;
        let mut kept_packing = None;
        let (ids, pos, layout) = if !packed {
            let layout = Layout::Padded {
                mask: causal_padding_mask(key_valid, 0, t),
                valid: key_valid.shallow_clone(),
                window_start: start,
                window_len: r,
                window_mask: causal_window_mask(key_valid, start, r),
            };
            (ids.shallow_clone(), pos.shallow_clone(), layout)
        } else {
            let packing = Packing::new(key_valid).map_err(EngineError::Batch)?;
            let window = packing.window(start, r);
            let spans = packing.attention_spans();
            let (ids, pos) = (packing.pack(ids), packing.pack(pos));
            match sp.filter(|g| g.size() > 1) {
                None => {
                    kept_packing = Some(packing);
                    (ids, pos, Layout::Packed { spans, window })
                }
                Some(group) => {
                    let n = packing.len();
                    let per = (n + group.size() as i64 - 1) / group.size() as i64;
                    let shard = |x: &Tensor| shard_of(x, group, per);
                    let (ids, pos) = (shard(&ids)?, shard(&pos)?);
                    let shard = SequenceShard::new(group, &window, per)?;
                    kept_packing = Some(packing);
                    let layout = Layout::Ulysses {
                        spans,
                        window,
                        shard,
                        per,
                    };
                    (ids, pos, layout)
                }
            }
        };
        let inputs = LayerInputs {
            ids,
            packing: kept_packing,
            cos: Tensor::new(),
            sin: Tensor::new(),
            layout,
            deepstack: Vec::new(),
        };
        let InputEmbeds { x, deepstack } = inputs.embed(model, embeds)?;
        let (cos, sin) = model.rotary().cos_sin(&pos, x.kind());
        Ok((
            x,
            LayerInputs {
                cos,
                sin,
                deepstack,
                ..inputs
            },
        ))
    }

    /// DeepStack levels the layers' outputs add.
    pub(super) fn deepstack_levels(&self) -> usize {
        self.deepstack.len()
    }

    /// The embedding (again, for its backward): the token embeddings of the layout's ids, or
    /// `embeds` `(B, T, hidden)` laid out as the ids are. Under Ulysses every rank computes
    /// the whole micro-batch's input embeddings (a vision tower sees all its images) and keeps
    /// its shard: the tower's gradient on each rank is its shard's share, summed with the
    /// other ranks' as every parameter's is.
    pub(super) fn embed(&self, model: &Model, embeds: Option<InputEmbeds>) -> Result<InputEmbeds> {
        let packed = |x: &Tensor| match &self.packing {
            Some(p) => Ok(p.pack(x)),
            None => Err(EngineError::Batch(
                "packed inputs without their packing".into(),
            )),
        };
        match (embeds, &self.layout) {
            (None, _) => Ok(InputEmbeds::tokens(model.f_embed(&self.ids)?)),
            (Some(x), Layout::Padded { .. }) => Ok(x),
            (Some(x), Layout::Packed { .. }) => x.map(packed),
            (Some(x), Layout::Ulysses { shard, per, .. }) => {
                x.map(|t| shard_of(&packed(t)?, &shard.group, *per))
            }
        }
    }

    /// Layer `i` of `layers` on its input `x`; the last layer returns only the head's window
    /// (except under Ulysses, where each rank's shard goes through whole).
    pub(super) fn layer_forward(
        &self,
        layers: &[DecoderLayer],
        i: usize,
        x: &Tensor,
    ) -> Result<Tensor> {
        let (layer, last) = (&layers[i], i + 1 == layers.len());
        let (cos, sin) = (&self.cos, &self.sin);
        // The last layer takes no DeepStack level (the model config is refused otherwise),
        // so its window-only output never needs one.
        let token_layout = match &self.layout {
            Layout::Padded { mask, valid, .. } if !last => TokenLayout::Padded {
                mask: Some(mask),
                valid: Some(valid),
                cache: None,
            },
            Layout::Padded {
                valid,
                window_start,
                window_len,
                window_mask,
                ..
            } => TokenLayout::Window {
                start: *window_start,
                len: *window_len,
                mask: window_mask,
                valid: Some(valid),
            },
            Layout::Packed { spans, .. } if !last => TokenLayout::Packed {
                spans,
                queries: None,
            },
            Layout::Packed { window, .. } => TokenLayout::Packed {
                spans: &window.spans,
                queries: Some(&window.tokens),
            },
            // Ulysses exchanges heads inside the token mixer.
            Layout::Ulysses { spans, shard, .. } => {
                let y = layer.forward_with(
                    x,
                    |attn, normed| ulysses_attention(attn, normed, cos, sin, spans, &shard.group),
                    |la, normed| ulysses_linear_attention(la, normed, spans, &shard.group),
                )?;
                return Ok(with_deepstack(y, &self.deepstack, i));
            }
        };
        let y = layer.forward(x, cos, sin, token_layout);
        Ok(with_deepstack(y, &self.deepstack, i))
    }

    /// The head's output from the last layer's output `last`.
    pub(super) fn head_output<H: FsdpHead>(
        &self,
        module: &H,
        last: &Tensor,
        mb: &Batch,
        fwd: &ForwardOptions,
    ) -> Result<H::Output> {
        let hidden = module.backbone().final_norm().forward(last);
        match &self.layout {
            Layout::Padded { .. } => module.output_from_window(&hidden, mb, fwd),
            Layout::Packed { window, .. } => {
                let labels = window.labels(mb.get("input_ids")?);
                let targets = packed_targets(mb, fwd, window)?;
                let columns = module.token_columns(&hidden, &labels, targets.as_ref(), fwd)?;
                module.output_from_columns(&window.unpack(&columns), fwd)
            }
            Layout::Ulysses { window, shard, .. } => {
                let labels = window.labels(mb.get("input_ids")?);
                let mine = hidden.f_index_select(1, &shard.local_window)?;
                let my_labels = shard.my_labels(&labels)?;
                let my_targets = match packed_targets(mb, fwd, window)? {
                    Some(t) => Some(t.narrow(1, shard.mine.0, shard.mine.1)?),
                    None => None,
                };
                let columns = module.token_columns(&mine, &my_labels, my_targets.as_ref(), fwd)?;
                let all = shard.gather(&columns)?;
                module.output_from_columns(&window.unpack(&all), fwd)
            }
        }
    }
}

/// The teacher's top-k at the window's tokens `(1, M, K)`, when the forward needs them.
fn packed_targets(
    mb: &Batch,
    fwd: &ForwardOptions,
    window: &PackedWindow,
) -> Result<Option<TopKTargets>> {
    match topk_targets(mb, fwd)? {
        Some(t) => Ok(Some(t.pack(&window.dest)?)),
        None => Ok(None),
    }
}

impl SequenceShard {
    fn new(group: &ProcessGroup, window: &PackedWindow, per: i64) -> Result<Self> {
        let p = group.size();
        let me = group.rank() as i64;
        let tokens = window.token_list();
        // Window tokens are in packed order, so each rank's are one run of them.
        let mut counts = vec![0i64; p];
        let mut pick = Vec::with_capacity(tokens.len());
        let (mut local, mut first_mine) = (Vec::new(), None);
        for (i, &k) in tokens.iter().enumerate() {
            let owner = (k / per) as usize;
            pick.push((owner, counts[owner]));
            counts[owner] += 1;
            if owner as i64 == me {
                first_mine.get_or_insert(i as i64);
                local.push(k - me * per);
            }
        }
        // Rank `owner` writes its j-th window token at row owner * per_rank + j.
        let per_rank = counts.iter().copied().max().unwrap_or(0).max(1);
        let pick: Vec<i64> = pick
            .into_iter()
            .map(|(owner, j)| owner as i64 * per_rank + j)
            .collect();
        let device = window.tokens.device();
        Ok(SequenceShard {
            group: group.clone(),
            mine: (first_mine.unwrap_or(0), local.len() as i64),
            local_window: Tensor::from_slice(&local).to_device(device),
            per_rank,
            pick: Tensor::from_slice(&pick).to_device(device),
        })
    }

    /// This rank's labels among the window's `(1, M)`.
    fn my_labels(&self, labels: &Tensor) -> Result<Tensor> {
        Ok(labels.f_narrow(1, self.mine.0, self.mine.1)?)
    }

    /// Every rank's per-token columns `(1, m, C)` joined into the window's `(1, M, C)`.
    fn gather(&self, columns: &Tensor) -> Result<Tensor> {
        let m = columns.size()[1];
        let padded = if m < self.per_rank {
            let mut s = columns.size();
            s[1] = self.per_rank - m;
            let pad = Tensor::zeros(&s[..], (columns.kind(), columns.device()));
            Tensor::f_cat(&[columns, &pad], 1)?
        } else {
            columns.shallow_clone()
        };
        let all = self
            .group
            .gather_same_differentiable(&padded, 1)
            .map_err(FsdpError::from)?;
        Ok(all.f_index_select(1, &self.pick)?)
    }
}

/// This rank's shard of `per` tokens of the packed `x` `(1, N, …)`, padded with zeros to the
/// group's `size × per`: the padding tokens belong to no span, so attention gives them zeros
/// and the head never reads them.
fn shard_of(x: &Tensor, group: &ProcessGroup, per: i64) -> Result<Tensor> {
    let n = x.size()[1];
    let total = per * group.size() as i64;
    let x = if total > n {
        let mut shape = x.size();
        shape[1] = total - n;
        let pad = Tensor::zeros(&shape[..], (x.kind(), x.device()));
        Tensor::f_cat(&[x, &pad], 1)?
    } else {
        x.shallow_clone()
    };
    Ok(x.f_narrow(1, group.rank() as i64 * per, per)?)
}

/// Attention of this rank's sequence shard `x` `(1, n, hidden)` under Ulysses: query, key and
/// value heads of the shard are exchanged for a shard of the heads over the whole packed
/// sequence (one all-to-all), attended per sequence, and exchanged back (another).
fn ulysses_attention(
    attn: &Attention,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    spans: &[AttentionSpan],
    group: &ProcessGroup,
) -> Result<Tensor> {
    // Qwen3.5's output gate is per token and head: it stays on the shard, applied after the
    // exchange back.
    let ([q, k, v], gate) = attn.gated_qkv_heads(x, cos, sin);
    let (h, kv) = attn.head_counts();
    let p = group.size() as i64;
    // Key/value heads that do not split over the group are repeated to one per query head.
    let (k, v) = if kv % p == 0 {
        (k, v)
    } else {
        let rep = h / kv;
        (
            k.f_repeat_interleave_self_int(rep, Some(1), None)?,
            v.f_repeat_interleave_self_int(rep, Some(1), None)?,
        )
    };
    let (n, d) = (x.size()[1], q.size()[3]);
    let kvh = k.size()[1];
    let (hq, hk) = (h / p, kvh / p);
    // Destination-major: rank j's query, key and value heads side by side.
    let qkv = Tensor::f_cat(
        &[
            q.f_reshape([1, p, hq, n, d])?,
            k.f_reshape([1, p, hk, n, d])?,
            v.f_reshape([1, p, hk, n, d])?,
        ],
        2,
    )?
    .f_reshape([1, p * (hq + 2 * hk), n, d])?;
    let full = group
        .all_to_all_differentiable(&qkv, 1, 2)
        .map_err(FsdpError::from)?;
    let q = full.f_narrow(1, 0, hq)?;
    let k = full.f_narrow(1, hq, hk)?;
    let v = full.f_narrow(1, hq + hk, hk)?;
    // This rank's heads: their sinks (a sliding window and a cap are the same for every head).
    let rank = group.rank() as i64;
    let sinks = attn.sinks_of(rank * hq..(rank + 1) * hq);
    let whole = attn.variant();
    let variant = AttentionVariant {
        sinks: sinks.as_ref(),
        window: whole.window,
        softcap: whole.softcap,
    };
    let y = attend_spans(&q, &k, &v, spans, &variant);
    let y = group
        .all_to_all_differentiable(&y, 2, 1)
        .map_err(FsdpError::from)?;
    Ok(attn.merge_gated_heads(&y, gate))
}

/// A Gated DeltaNet layer on this rank's sequence shard `x` `(1, n, hidden)` under Ulysses:
/// the shard's projections (per token) are exchanged for a share of the heads over the whole
/// packed sequence (one all-to-all), the recurrence runs per sequence on those heads, and the
/// heads' outputs are exchanged back (another) before `out_proj`: the same split of work as
/// [`ulysses_attention`], with the key and value heads split evenly over the group.
fn ulysses_linear_attention(
    la: &GatedDeltaNet,
    x: &Tensor,
    spans: &[AttentionSpan],
    group: &ProcessGroup,
) -> Result<Tensor> {
    let p = group.size() as i64;
    if la.heads_per_part(p).is_none() {
        return Err(FsdpError::Config(format!(
            "Ulysses of degree {p} does not divide the Gated DeltaNet's key and value heads"
        ))
        .into());
    }
    let proj = la.project(x, None);
    // Destination-major: rank j's channels of every projection side by side.
    let mut widths = [0i64; 4];
    let mut parts = Vec::with_capacity(p as usize);
    for j in 0..p {
        let mine = la.select_heads(&proj, HeadSlice { part: j, parts: p });
        let pieces = [mine.mixed, mine.z, mine.b, mine.a];
        for (w, t) in widths.iter_mut().zip(&pieces) {
            *w = t.size()[2];
        }
        parts.push(Tensor::f_cat(&pieces, 2)?);
    }
    let full = group
        .all_to_all_differentiable(&Tensor::f_cat(&parts, 2)?, 2, 1)
        .map_err(FsdpError::from)?;
    let pieces = full.f_split_with_sizes(widths, 2)?;
    let [mixed, z, b, a] = <[Tensor; 4]>::try_from(pieces)
        .map_err(|_| FsdpError::Config("projections split into the wrong parts".into()))
        .map_err(EngineError::from)?;
    let heads = HeadSlice {
        part: group.rank() as i64,
        parts: p,
    };
    let y = la.mix_spans(&Projected { mixed, z, b, a }, heads, spans);
    let y = group
        .all_to_all_differentiable(&y, 1, 2)
        .map_err(FsdpError::from)?;
    Ok(la.out_proj.forward(&y))
}
