//! Batched generation: prompts are left-padded to a common width, prefilled once into a
//! preallocated KV cache (shared by the `n` samples of a prompt, then copied per sample), and
//! decoded one token per step until every sequence has emitted an EOS id or the response
//! length is reached; sequences that have ended leave the decoding batch. Positions follow the
//! attention mask (`cumsum - 1`), so padded and unpadded prompts give the same tokens.

use tch::{Device, Kind, Tensor};

use crate::engine::batch::RowImages;
use crate::model::vision::ProcessedImage;
use crate::model::{CausalLm, position_ids_from_mask};
use crate::rng::Rng;

use super::decoder::Decoder;
use super::sampling::uniforms;
use super::vocab_head::HeadLogits;
use super::{LogProbPath, RolloutError, SamplingParams};
use crate::logits::SequenceBatch;
use crate::model::KvCache;

/// Token ids that end a response, and the id used for padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopTokens {
    pub eos: Vec<i64>,
    pub pad: i64,
}

/// The weights a row was generated with when they changed during the call (a partial rollout:
/// [`generate_interruptible`]); `None` stands for the weights the call began with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowVersions {
    /// The version that generated the row's first token.
    pub first: Option<u64>,
    /// The version that generated its last token.
    pub last: Option<u64>,
}

/// Asked before every decoded token: `Some(version)` when the model's weights were replaced
/// meanwhile (the rows still decoding then continue with them), `None` to go on. It may block
/// while the rollout is paused.
pub type WeightSwap<'a> = dyn FnMut() -> Result<Option<u64>, RolloutError> + 'a;

/// Generated batch in verl's layout; `N = prompts x n`, rows of one prompt adjacent.
#[derive(Debug)]
pub struct RolloutOutput {
    /// (N, P) left-padded prompt ids.
    pub prompts: Tensor,
    /// (N, R) response ids, padded after the end with the pad id; R = `max_new_tokens`.
    pub responses: Tensor,
    /// (N, P + R) prompts then responses.
    pub input_ids: Tensor,
    /// (N, P + R) int64: 1 on prompt tokens and on response tokens up to and including EOS.
    pub attention_mask: Tensor,
    /// (N, P + R) int64 positions (padding gets 1, as transformers).
    pub position_ids: Tensor,
    /// (N, R) int64: 1 on response tokens up to and including EOS.
    pub response_mask: Tensor,
    /// (N, R) f32 log-probabilities of the response tokens (0 where masked).
    pub rollout_log_probs: Tensor,
    /// Valid response tokens per row.
    pub response_lengths: Vec<usize>,
    /// True where the response ended with an EOS id (false: cut at the length limit).
    pub finished: Vec<bool>,
    /// Index into the prompt slice of each row.
    pub prompt_index: Vec<usize>,
    /// Rows run through the model after the prefill, summed over steps: rows that ended
    /// leave the batch, so this is near the response tokens generated, not rows x length.
    pub decoded_rows: usize,
    /// Per row, with the tool agent loop: verl's `num_turns` (empty for single turns).
    pub num_turns: Vec<usize>,
    /// Per row, with the tool agent loop: its tool calls, and how many of them failed.
    pub tool_calls: Vec<usize>,
    pub tool_failures: Vec<usize>,
    /// Per row, with the tool agent loop: the rewards its tool calls returned.
    pub tool_rewards: Vec<Vec<f64>>,
    /// Per row, with an interaction: the rewards of its replies (verl's `turn_scores`).
    pub turn_scores: Vec<Vec<f64>>,
    /// Per row, from a Python agent loop: its `AgentLoopOutput.reward_score` (empty when no
    /// row came from one). verl scores a batch with these when every row has one.
    pub loop_scores: Vec<Option<f64>>,
    /// Per row, when the weights changed while the batch decoded (empty: they did not).
    pub versions: Vec<RowVersions>,
}

/// Generates `params.n` responses for each prompt, left-padding prompts to the longest.
pub fn generate(
    model: &CausalLm,
    prompts: &[Vec<i64>],
    params: &SamplingParams,
    stop: &StopTokens,
) -> Result<RolloutOutput, RolloutError> {
    generate_padded(model, prompts, params, stop, None)
}

/// [`generate`] with prompts left-padded to `prompt_width` (verl pads to
/// `max_prompt_length`, giving the same shapes every step); a longer prompt is an error.
pub fn generate_padded(
    model: &CausalLm,
    prompts: &[Vec<i64>],
    params: &SamplingParams,
    stop: &StopTokens,
    prompt_width: Option<usize>,
) -> Result<RolloutOutput, RolloutError> {
    generate_with(model, prompts, params, stop, prompt_width)
}

/// [`generate_padded`] on any [`Decoder`] (a Megatron rank's shards: every rank of the model
/// calls it with the same prompts and parameters, and every rank gets the whole output).
pub fn generate_with<D: Decoder>(
    model: &D,
    prompts: &[Vec<i64>],
    params: &SamplingParams,
    stop: &StopTokens,
    prompt_width: Option<usize>,
) -> Result<RolloutOutput, RolloutError> {
    let streams = PromptStream::consecutive(params.seed, 0, prompts.len());
    generate_streams(model, prompts, &streams, params, stop, prompt_width)
}

/// Where the uniform numbers of one prompt's samples come from: sample `j` of the prompt draws
/// from `Rng::derive(seed, index * n + j)`. A prompt keeps its stream wherever it is generated
/// (in a chunk of the batch, on another rollout replica, beside another rank's prompts), so
/// its tokens do not depend on how the batch was split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptStream {
    pub seed: u64,
    pub index: u64,
}

impl PromptStream {
    /// The streams of `count` prompts at positions `first..` of a batch sampled with `seed`.
    pub fn consecutive(seed: u64, first: usize, count: usize) -> Vec<PromptStream> {
        (first..first + count)
            .map(|i| PromptStream {
                seed,
                index: i as u64,
            })
            .collect()
    }
}

/// [`generate_with`] with each prompt's sampling stream given (`streams[i]` for `prompts[i]`;
/// `params.seed` is not read).
pub fn generate_streams<D: Decoder>(
    model: &D,
    prompts: &[Vec<i64>],
    streams: &[PromptStream],
    params: &SamplingParams,
    stop: &StopTokens,
    prompt_width: Option<usize>,
) -> Result<RolloutOutput, RolloutError> {
    generate_images(model, prompts, &[], streams, params, stop, prompt_width)
}

/// [`generate_streams`] of a vision-language model: `images[i]` are the images of
/// `prompts[i]`, whose placeholders they fill (empty: no prompt has images). The prompts are
/// prefilled with their images and multimodal positions; the output's `position_ids` are
/// `(N, P + R, 3)` (a response token's three ids are equal, one past its predecessor's).
pub fn generate_images<D: Decoder>(
    model: &D,
    prompts: &[Vec<i64>],
    images: &[RowImages],
    streams: &[PromptStream],
    params: &SamplingParams,
    stop: &StopTokens,
    prompt_width: Option<usize>,
) -> Result<RolloutOutput, RolloutError> {
    let input = GenerateInput {
        prompts,
        images,
        streams,
        prompt_width,
    };
    generate_interruptible(model, input, params, stop, &mut || Ok(None))
}

/// What one generation call decodes: the prompts, their images (empty: none has any) and
/// sampling streams, and the width prompts are left-padded to (`None`: the longest).
#[derive(Debug, Clone, Copy)]
pub struct GenerateInput<'a> {
    pub prompts: &'a [Vec<i64>],
    pub images: &'a [RowImages],
    pub streams: &'a [PromptStream],
    pub prompt_width: Option<usize>,
}

/// [`generate_images`] whose weights may change while it decodes (verl's partial rollout:
/// requests aborted at a weight sync resume with the new weights). Before every token `swap`
/// says whether the model's weights were replaced; if so, the rows still decoding are
/// prefilled again, prompt and response so far, with the new weights (as vLLM recomputes a
/// resumed request) and continue from there with their own sampling streams. A row's tokens
/// keep the log-probs of the weights that chose them, and `versions` says which those were.
pub fn generate_interruptible<D: Decoder>(
    model: &D,
    input: GenerateInput<'_>,
    params: &SamplingParams,
    stop: &StopTokens,
    swap: &mut WeightSwap<'_>,
) -> Result<RolloutOutput, RolloutError> {
    let GenerateInput {
        prompts,
        images,
        streams,
        prompt_width,
    } = input;
    params.validate().map_err(RolloutError::Params)?;
    if !images.is_empty() && images.len() != prompts.len() {
        return Err(RolloutError::Batch(format!(
            "images for {} prompts, {} prompts",
            images.len(),
            prompts.len()
        )));
    }
    if !model.has_vision() && images.iter().any(|i| !i.is_empty()) {
        return Err(RolloutError::Batch(
            "prompts with images need a vision-language model".into(),
        ));
    }
    if model.has_vision() && params.log_prob_path == LogProbPath::Recompute {
        return Err(RolloutError::Params(
            "a vision-language rollout keeps the decoding pass's log-probs (the recomputing forward takes no images)".into(),
        ));
    }
    if prompts.is_empty() {
        return Err(RolloutError::Batch("no prompts".into()));
    }
    if streams.len() != prompts.len() {
        return Err(RolloutError::Batch(format!(
            "{} sampling streams for {} prompts",
            streams.len(),
            prompts.len()
        )));
    }
    let vocab = model.config().vocab_size;
    for (index, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(RolloutError::Prompt {
                index,
                msg: "empty prompt".into(),
            });
        }
        if let Some(bad) = p.iter().find(|&&t| t < 0 || t >= vocab) {
            return Err(RolloutError::Prompt {
                index,
                msg: format!("token id {bad} outside the vocabulary ({vocab})"),
            });
        }
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
    let width = match prompt_width {
        Some(w) if w < longest => {
            let index = prompts.iter().position(|p| p.len() == longest).unwrap_or(0);
            return Err(RolloutError::Prompt {
                index,
                msg: format!("{longest} tokens exceed prompt_width = {w}"),
            });
        }
        Some(w) => w as i64,
        None => longest as i64,
    };
    let chunk = params.max_prompts_per_pass.unwrap_or(prompts.len());
    let mut swaps = Swaps {
        poll: swap,
        current: None,
    };
    let parts: Vec<Chunk> = tch::no_grad(|| {
        let mut head = model.head(params);
        prompts
            .chunks(chunk)
            .zip(streams.chunks(chunk))
            .enumerate()
            .map(|(i, (ps, ss))| {
                let imgs = images.get(i * chunk..(i * chunk + ps.len()).min(images.len()));
                let prompts = ChunkPrompts {
                    ids: ps,
                    images: imgs.unwrap_or_default(),
                    streams: ss,
                };
                generate_chunk(model, &mut head, prompts, width, params, stop, &mut swaps)
            })
            .collect::<Result<_, _>>()
    })?;
    let cat = |f: fn(&Chunk) -> &Tensor| Tensor::cat(&parts.iter().map(f).collect::<Vec<_>>(), 0);
    let rows = Rows {
        prompts: cat(|c| &c.prompts),
        prompt_mask: cat(|c| &c.prompt_mask),
        prompt_pos: cat(|c| &c.prompt_pos),
        responses: cat(|c| &c.responses),
        log_probs: cat(|c| &c.log_probs),
    };
    let decoded_rows = parts.iter().map(|c| c.decoded_rows).sum();
    let recompute = (params.log_prob_path == LogProbPath::Recompute).then_some(model);
    let mut out = rows.finish(prompts.len(), params, stop, decoded_rows, recompute)?;
    if swaps.current.is_some() {
        out.versions = parts.into_iter().flat_map(|c| c.versions).collect();
    }
    Ok(out)
}

/// The weight swaps of one call: the caller's poll, and the version the last swap brought
/// (`None`: no swap yet, the weights the call began with).
struct Swaps<'s, 'a> {
    poll: &'s mut WeightSwap<'a>,
    current: Option<u64>,
}

/// A generated batch before its masks: left-padded prompts with their mask, right-padded
/// responses and their log-probs, `n` rows per prompt.
struct Rows {
    prompts: Tensor,
    prompt_mask: Tensor,
    /// The prompts' positions: `(N, P)`, or `(N, P, 3)` for a vision-language model.
    prompt_pos: Tensor,
    responses: Tensor,
    log_probs: Tensor,
}

impl Rows {
    /// verl's layout of the batch: masks up to the first EOS, positions, and (with
    /// `recompute`) the log-probs of the training forward instead of the decoding pass's.
    fn finish<D: Decoder>(
        self,
        prompt_count: usize,
        params: &SamplingParams,
        stop: &StopTokens,
        decoded_rows: usize,
        recompute: Option<&D>,
    ) -> Result<RolloutOutput, RolloutError> {
        let Rows {
            prompts: prompts_t,
            prompt_mask,
            prompt_pos,
            responses,
            mut log_probs,
        } = self;
        let (n, r) = (params.n, params.max_new_tokens as i64);
        let response_mask = response_mask(&responses, &stop.eos, params.ignore_eos);
        let input_ids = Tensor::cat(&[&prompts_t, &responses], 1);
        let attention_mask = Tensor::cat(&[&prompt_mask, &response_mask], 1);
        let position_ids = with_response_positions(&prompt_pos, r);
        if let Some(model) = recompute {
            let batch = SequenceBatch {
                input_ids: &input_ids,
                attention_mask: &attention_mask,
                position_ids: &position_ids,
            };
            let temperature = if params.is_greedy() {
                1.0
            } else {
                params.temperature
            };
            log_probs =
                model.recompute_log_probs(&batch, r, temperature, params.log_prob_micro_batch)?;
        }
        let log_probs = log_probs * response_mask.to_kind(Kind::Float);
        let lengths = Vec::<i64>::try_from(response_mask.sum_dim_intlist(1, false, Kind::Int64))?;
        let ends = Vec::<i64>::try_from(
            Tensor::isin(
                &responses,
                &Tensor::from_slice(&stop.eos).to_device(responses.device()),
                false,
                false,
            )
            .logical_and(&response_mask.to_kind(Kind::Bool))
            .any_dim(1, false)
            .to_kind(Kind::Int64),
        )?;
        Ok(RolloutOutput {
            prompts: prompts_t,
            responses,
            input_ids,
            attention_mask,
            position_ids,
            response_mask,
            rollout_log_probs: log_probs,
            response_lengths: lengths.iter().map(|&l| l as usize).collect(),
            finished: ends.iter().map(|&e| e != 0 && !params.ignore_eos).collect(),
            prompt_index: (0..prompt_count * n).map(|i| i / n).collect(),
            decoded_rows,
            num_turns: Vec::new(),
            tool_calls: Vec::new(),
            tool_failures: Vec::new(),
            tool_rewards: Vec::new(),
            turn_scores: Vec::new(),
            loop_scores: Vec::new(),
            versions: Vec::new(),
        })
    }
}

/// The position ids of left-padded prompts (`(N, P)`, or `(N, P, 3)` multimodal) followed by
/// `r` response tokens, each one past its predecessor on every axis (left padding: every row's
/// last prompt column is real).
pub fn with_response_positions(prompt_pos: &Tensor, r: i64) -> Tensor {
    let width = prompt_pos.size()[1];
    let last = prompt_pos.narrow(1, width - 1, 1);
    let steps = Tensor::arange_start(1, r + 1, (Kind::Int64, prompt_pos.device()));
    let resp_pos = if prompt_pos.dim() == 3 {
        last + steps.view([1, r, 1])
    } else {
        last + steps.unsqueeze(0)
    };
    Tensor::cat(&[prompt_pos, &resp_pos], 1)
}

/// The batch of an external engine (vLLM) in verl's layout: `responses[k]` and
/// `log_probs[k]` are row `k`'s generated tokens (ending at its stop token, which the engine
/// stops at) and their log-probs, `params.n` rows per prompt in prompt order; every generated
/// token is the model's, so it is [`from_trajectory_rows`] with the whole row in the mask.
pub fn from_token_rows(
    prompts: &[Vec<i64>],
    responses: &[Vec<i64>],
    log_probs: &[Vec<f32>],
    params: &SamplingParams,
    stop: &StopTokens,
) -> Result<RolloutOutput, RolloutError> {
    let n = params.n;
    if responses.len() != prompts.len() * n {
        return Err(RolloutError::Batch(format!(
            "{} responses for {} prompts x n = {n}",
            responses.len(),
            prompts.len()
        )));
    }
    let repeated: Vec<Vec<i64>> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), n))
        .collect();
    let masks: Vec<Vec<i64>> = responses.iter().map(|r| vec![1; r.len()]).collect();
    let mut out = from_trajectory_rows(
        &repeated,
        responses,
        &masks,
        log_probs,
        params.max_new_tokens,
        stop,
    )?;
    out.prompt_index = (0..responses.len()).map(|k| k / n).collect();
    if params.ignore_eos {
        out.finished.fill(false);
    }
    Ok(out)
}

/// Multi-turn trajectories in verl's layout: row `k` is `prompts[k]` (left-padded to the
/// longest) then `responses[k]` (every turn, right-padded to `response_length`), attended up
/// to its end, with `loss_masks[k]` as the response mask (0 on tool tokens) and the
/// log-probs of generated tokens.
pub fn from_trajectory_rows(
    prompts: &[Vec<i64>],
    responses: &[Vec<i64>],
    loss_masks: &[Vec<i64>],
    log_probs: &[Vec<f32>],
    response_length: usize,
    stop: &StopTokens,
) -> Result<RolloutOutput, RolloutError> {
    let rows = prompts.len();
    if [responses.len(), loss_masks.len(), log_probs.len()] != [rows; 3] {
        return Err(RolloutError::Batch(
            "trajectory rows, masks and log-probs differ in number".into(),
        ));
    }
    let width = prompts.iter().map(Vec::len).max().unwrap_or(1) as i64;
    let (prompts_t, prompt_mask) = left_pad(prompts, width, stop.pad, Device::Cpu);
    let r = response_length;
    let mut tokens = vec![stop.pad; rows * r];
    let mut valid = vec![0i64; rows * r];
    let mut loss = vec![0i64; rows * r];
    let mut logp = vec![0f32; rows * r];
    for k in 0..rows {
        let n = responses[k].len();
        if n > r || loss_masks[k].len() != n || log_probs[k].len() != n {
            return Err(RolloutError::Batch(format!(
                "trajectory {k}: {n} tokens, {} mask entries, {} log-probs, response length {r}",
                loss_masks[k].len(),
                log_probs[k].len()
            )));
        }
        tokens[k * r..k * r + n].copy_from_slice(&responses[k]);
        loss[k * r..k * r + n].copy_from_slice(&loss_masks[k]);
        logp[k * r..k * r + n].copy_from_slice(&log_probs[k]);
        valid[k * r..k * r + n].fill(1);
    }
    let shape = [rows as i64, r as i64];
    let responses_t = Tensor::from_slice(&tokens).view(shape);
    let valid_t = Tensor::from_slice(&valid).view(shape);
    let prompt_pos = position_ids_from_mask(&prompt_mask);
    let count = prompt_mask.sum_dim_intlist(1, true, Kind::Int64);
    let resp_pos = count + Tensor::arange(r as i64, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let response_mask = Tensor::from_slice(&loss).view(shape);
    Ok(RolloutOutput {
        input_ids: Tensor::cat(&[&prompts_t, &responses_t], 1),
        attention_mask: Tensor::cat(&[&prompt_mask, &valid_t], 1),
        position_ids: Tensor::cat(&[&prompt_pos, &resp_pos], 1),
        rollout_log_probs: Tensor::from_slice(&logp).view(shape)
            * response_mask.to_kind(Kind::Float),
        response_mask,
        prompts: prompts_t,
        responses: responses_t,
        response_lengths: responses.iter().map(Vec::len).collect(),
        finished: responses
            .iter()
            .map(|row| row.last().is_some_and(|t| stop.eos.contains(t)))
            .collect(),
        prompt_index: (0..rows).collect(),
        decoded_rows: responses.iter().map(Vec::len).sum(),
        num_turns: Vec::new(),
        tool_calls: Vec::new(),
        tool_failures: Vec::new(),
        tool_rewards: Vec::new(),
        turn_scores: Vec::new(),
        loop_scores: Vec::new(),
        versions: Vec::new(),
    })
}

/// 1 up to and including the first EOS of each row, 0 after it.
fn response_mask(responses: &Tensor, eos: &[i64], ignore_eos: bool) -> Tensor {
    if ignore_eos || eos.is_empty() {
        return responses.ones_like();
    }
    let hit = Tensor::isin(
        responses,
        &Tensor::from_slice(eos).to_device(responses.device()),
        false,
        false,
    )
    .to_kind(Kind::Int64);
    let before = hit.cumsum(1, Kind::Int64) - &hit;
    before.eq(0).to_kind(Kind::Int64)
}

struct Chunk {
    prompts: Tensor,
    prompt_mask: Tensor,
    prompt_pos: Tensor,
    responses: Tensor,
    log_probs: Tensor,
    decoded_rows: usize,
    versions: Vec<RowVersions>,
}

fn left_pad(prompts: &[Vec<i64>], width: i64, pad: i64, device: Device) -> (Tensor, Tensor) {
    let mut ids = Vec::with_capacity(prompts.len() * width as usize);
    let mut mask = Vec::with_capacity(ids.capacity());
    for p in prompts {
        let padding = width as usize - p.len();
        ids.extend(std::iter::repeat_n(pad, padding).chain(p.iter().copied()));
        mask.extend(std::iter::repeat_n(0i64, padding).chain(std::iter::repeat_n(1, p.len())));
    }
    let shape = [prompts.len() as i64, width];
    (
        Tensor::from_slice(&ids).view(shape).to_device(device),
        Tensor::from_slice(&mask).view(shape).to_device(device),
    )
}

/// One pass's prompts: their ids, images (empty: none has any) and sampling streams.
struct ChunkPrompts<'a> {
    ids: &'a [Vec<i64>],
    images: &'a [RowImages],
    streams: &'a [PromptStream],
}

fn generate_chunk<D: Decoder>(
    model: &D,
    head: &mut D::Head,
    ChunkPrompts {
        ids: prompts,
        images,
        streams,
    }: ChunkPrompts<'_>,
    width: i64,
    params: &SamplingParams,
    stop: &StopTokens,
    swaps: &mut Swaps<'_, '_>,
) -> Result<Chunk, RolloutError> {
    let device = model.device();
    let (n, r) = (params.n as i64, params.max_new_tokens as i64);
    let b = prompts.len() as i64;
    let rows = b * n;
    let (ids, mask) = left_pad(prompts, width, stop.pad, device);

    // Prefill once per prompt, then give each of the n samples its own copy of the cache.
    let mut prefill = model.cache(b, if n == 1 { width + r } else { width });
    let (mut logits, pos) = if model.has_vision() {
        let flat: Vec<&ProcessedImage> = images.iter().flat_map(|i| i.iter()).collect();
        model.prefill_images(head, &ids, &mask, &flat, &mut prefill)?
    } else {
        let pos = position_ids_from_mask(&mask);
        (
            model.next_logits(head, &ids, &pos, &mask, &mut prefill)?,
            pos,
        )
    };
    let repeat = Tensor::arange(b, (Kind::Int64, device)).repeat_interleave_self_int(n, 0, None);
    let mut cache = if n == 1 {
        prefill
    } else {
        prefill.select_rows(&repeat, width + r)
    };
    let (ids, mask, pos) = if n == 1 {
        (ids, mask, pos)
    } else {
        (
            ids.index_select(0, &repeat),
            mask.index_select(0, &repeat),
            pos.index_select(0, &repeat),
        )
    };
    if n > 1 {
        logits = logits.map(|l| l.select_rows(&repeat));
    }

    let mut rngs: Vec<Rng> = streams
        .iter()
        .flat_map(|s| (0..n as u64).map(move |j| Rng::derive(s.seed, s.index * n as u64 + j)))
        .collect();
    // Every row's uniform number for every token, on the device before decoding starts.
    let mut u = if params.is_greedy() {
        Tensor::zeros([rows, r], (Kind::Float, device))
    } else {
        uniforms(&mut rngs, r as usize, device)
    };
    // How often the host reads which rows have ended (to stop, or to compact the batch): every
    // token on CPU, where that read is free; every 8 tokens on an accelerator, where it waits
    // for the device. Rows that ended meanwhile emit padding, masked on the device.
    let check_every = if device == Device::Cpu { 1 } else { 8 };
    let responses = Tensor::full([rows, r], stop.pad, (Kind::Int64, device));
    let log_probs = Tensor::zeros([rows, r], (Kind::Float, device));
    let mut key_mask = Tensor::cat(&[&mask, &Tensor::ones([rows, r], (Kind::Int64, device))], 1);
    let eos = Tensor::from_slice(&stop.eos).to_device(device);
    let mut done = Tensor::zeros([rows], (Kind::Bool, device));
    // Decoding positions are text positions: a multimodal prompt's last token (text) has
    // three equal ids.
    let mut last_prompt_pos = match pos.dim() {
        3 => pos.narrow(1, width - 1, 1).select(2, 0),
        _ => pos.narrow(1, width - 1, 1),
    };
    // The chunk rows still decoding, in the order of the batch the model sees (None: all).
    let mut live: Option<Tensor> = None;
    let mut decoded_rows = 0;
    let at_start = RowVersions {
        first: swaps.current,
        last: swaps.current,
    };
    let mut versions = vec![at_start; rows as usize];
    for t in 0..r {
        if let Some(version) = (swaps.poll)()? {
            swaps.current = Some(version);
            *head = model.head(params);
            let decoding = Decoding {
                ids: &ids,
                responses: &responses,
                key_mask: &key_mask,
                images,
                n,
                width,
                t,
            };
            let (fresh_logits, fresh_cache, rows_now) =
                prefill_again(model, head, &decoding, live.as_ref(), cache.capacity())?;
            let done_now = Vec::<i64>::try_from(done.to_kind(Kind::Int64))?;
            for (&row, &ended) in rows_now.iter().zip(&done_now) {
                if ended == 0 {
                    versions[row as usize].last = Some(version);
                }
            }
            logits = fresh_logits;
            cache = fresh_cache;
        }
        let (tokens, logp) = model.choose(logits.as_ref(), params, &u.select(1, t))?;
        let mut tokens = tokens.masked_fill(&done, stop.pad);
        let logp = logp.masked_fill(&done, 0.0);
        let mut token_col = responses.narrow(1, t, 1);
        let mut logp_col = log_probs.narrow(1, t, 1);
        match &live {
            None => {
                token_col.copy_(&tokens.unsqueeze(1));
                logp_col.copy_(&logp.unsqueeze(1));
            }
            Some(rows) => {
                let _ = token_col.index_copy_(0, rows, &tokens.unsqueeze(1));
                let _ = logp_col.index_copy_(0, rows, &logp.unsqueeze(1));
            }
        }
        if !params.ignore_eos && !stop.eos.is_empty() {
            done = done.logical_or(&Tensor::isin(&tokens, &eos, false, false));
            // Between reads nothing counts as finished: no stop, no compaction.
            let finished = if (t + 1) % check_every == 0 {
                done.sum(Kind::Int64).int64_value(&[])
            } else {
                0
            };
            let batch = done.size()[0];
            if finished == batch {
                break;
            }
            // Finished rows leave the batch once they are an eighth of it: the cache copy
            // this costs is paid back by the smaller steps, and a row waits at most until
            // then.
            if t + 1 < r && finished * 8 >= batch {
                let keep = done.logical_not().nonzero().squeeze_dim(1);
                u = u.index_select(0, &keep);
                cache = cache.select_rows(&keep, cache.capacity());
                key_mask = key_mask.index_select(0, &keep);
                last_prompt_pos = last_prompt_pos.index_select(0, &keep);
                tokens = tokens.index_select(0, &keep);
                live = Some(match &live {
                    None => keep.shallow_clone(),
                    Some(rows) => rows.index_select(0, &keep),
                });
                done = Tensor::zeros([keep.size()[0]], (Kind::Bool, device));
            }
        }
        if t + 1 == r {
            break;
        }
        decoded_rows += tokens.size()[0] as usize;
        let step_mask = key_mask.narrow(1, 0, width + t + 1);
        let step_pos = &last_prompt_pos + (t + 1);
        logits = model.next_logits(
            head,
            &tokens.unsqueeze(1),
            &step_pos,
            &step_mask,
            &mut cache,
        )?;
    }
    Ok(Chunk {
        prompts: ids,
        prompt_mask: mask,
        prompt_pos: pos,
        responses,
        log_probs,
        decoded_rows,
        versions,
    })
}

/// A chunk's decoding state at token `t`, as [`prefill_again`] reads it: the rows' padded
/// prompts `(rows, width)`, the responses so far `(rows, R)`, the key mask of the rows still
/// in the batch `(live, width + R)`, and the prompts' images (`n` rows per prompt).
struct Decoding<'a> {
    ids: &'a Tensor,
    responses: &'a Tensor,
    key_mask: &'a Tensor,
    images: &'a [RowImages],
    n: i64,
    width: i64,
    t: i64,
}

/// The rows still in the decoding batch (`live`; `None`: every row), prefilled again with the
/// model's current weights over their prompt and response so far: the logits of token `t`, a
/// cache of `capacity` positions holding the rest, and the rows in batch order.
fn prefill_again<D: Decoder>(
    model: &D,
    head: &mut D::Head,
    d: &Decoding<'_>,
    live: Option<&Tensor>,
    capacity: i64,
) -> Result<(Option<HeadLogits>, KvCache, Vec<i64>), RolloutError> {
    let rows_now: Vec<i64> = match live {
        Some(rows) => Vec::<i64>::try_from(rows)?,
        None => (0..d.ids.size()[0]).collect(),
    };
    let index = Tensor::from_slice(&rows_now).to_device(d.ids.device());
    let seq = Tensor::cat(
        &[
            d.ids.index_select(0, &index),
            d.responses.narrow(1, 0, d.t).index_select(0, &index),
        ],
        1,
    );
    let mask = d.key_mask.narrow(1, 0, d.width + d.t);
    let mut cache = model.cache(rows_now.len() as i64, capacity);
    let logits = if model.has_vision() {
        let images: Vec<&ProcessedImage> = rows_now
            .iter()
            .filter_map(|&row| d.images.get((row / d.n) as usize))
            .flat_map(|i| i.iter())
            .collect();
        model
            .prefill_images(head, &seq, &mask, &images, &mut cache)?
            .0
    } else {
        let pos = position_ids_from_mask(&mask);
        model.next_logits(head, &seq, &pos, &mask, &mut cache)?
    };
    Ok((logits, cache, rows_now))
}
