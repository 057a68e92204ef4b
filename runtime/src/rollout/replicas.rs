//! Rollout replicas laid out differently from training: when the rollout's tensor parallel
//! size `r` differs from training's `t` (verl's `rollout.tensor_model_parallel_size`), a
//! rollout replica is not one data-parallel rank's model any more, so the prompts of the
//! data-parallel ranks are shared out among the replicas and the outputs brought back.
//!
//! - [`ReplicaShare::Split`] (`r < t`): the `t / r` replicas inside one training TP group each
//!   generate a contiguous part of that data-parallel rank's prompts; the parts are then
//!   all-gathered, so every rank ends with the whole output, as without resharding.
//! - [`ReplicaShare::Join`] (`r > t`): one replica spans `r / t` data-parallel ranks; their
//!   prompts (and sampling seeds) are all-gathered, the replica generates them together and
//!   each rank keeps its own rows.
//!
//! Every prompt keeps its sampling stream ([`PromptStream`]: its own rank's seed, its index on
//! that rank), so the tokens are those the training layout's rollout draws; only the float
//! rounding of the other weight layout differs.
use tch::{Device, Kind, Tensor};

use crate::parallel::dist::ProcessGroup;

pub use crate::engine::hybrid::ReplicaShare;

use super::decoder::Decoder;
use super::engine::{PromptStream, RolloutOutput, StopTokens, generate_images};
use super::{RolloutError, SamplingParams};
use crate::engine::batch::RowImages;
use crate::model::vision::ProcessedImage;

fn dist(e: impl std::fmt::Display) -> RolloutError {
    RolloutError::Batch(format!("rollout replicas: {e}"))
}

impl ReplicaShare {
    /// Generates `params.n` responses for each of this rank's `prompts` on `model` (this
    /// rank's shards of its replica); the output is the one the training layout's rollout
    /// gives for these prompts (rows, order, prompt indices), up to rounding.
    ///
    /// `images[i]` are the images of `prompts[i]` (empty: no prompt has any); they travel with
    /// their prompts, and a vision-language model's positions `(rows, T, 3)` with the rows.
    pub fn generate<D: Decoder>(
        &self,
        model: &D,
        prompts: &[Vec<i64>],
        images: &[RowImages],
        params: &SamplingParams,
        stop: &StopTokens,
    ) -> Result<RolloutOutput, RolloutError> {
        if !images.is_empty() && images.len() != prompts.len() {
            return Err(RolloutError::Batch(format!(
                "images for {} prompts, {} prompts",
                images.len(),
                prompts.len()
            )));
        }
        // A Megatron replica's shards take images only (their pixels travel as grids here).
        if images
            .iter()
            .flat_map(|r| r.iter())
            .any(|i| i.seconds_per_grid.is_some())
        {
            return Err(RolloutError::Batch(
                "videos run on a whole model (FSDP or one process, the built-in rollout); Megatron's rollout replicas take images only".into(),
            ));
        }
        match self {
            ReplicaShare::Split { peers } => split(model, peers, prompts, images, params, stop),
            ReplicaShare::Join { peers } => join(model, peers, prompts, images, params, stop),
        }
    }
}

/// Position ids per token: three (M-RoPE) for a vision-language model, else one.
fn position_axes<D: Decoder>(model: &D) -> i64 {
    if model.has_vision() { 3 } else { 1 }
}

fn split<D: Decoder>(
    model: &D,
    peers: &ProcessGroup,
    prompts: &[Vec<i64>],
    images: &[RowImages],
    params: &SamplingParams,
    stop: &StopTokens,
) -> Result<RolloutOutput, RolloutError> {
    if prompts.is_empty() {
        return Err(RolloutError::Batch("no prompts".into()));
    }
    let (k, c) = (peers.size(), peers.rank());
    let part = c * prompts.len() / k..(c + 1) * prompts.len() / k;
    // Every part is padded to the longest prompt of the whole list, so the parts stack.
    let width = prompts.iter().map(Vec::len).max().unwrap_or(1);
    let (p, r) = (width as i64, params.max_new_tokens as i64);
    let axes = position_axes(model);
    let device = model.device();
    let (ints, floats, decoded) = if part.is_empty() {
        // Fewer prompts than replicas: this replica (all of its ranks alike) has nothing to do.
        (
            Tensor::f_zeros([0, packed_width(p, r, axes)], (Kind::Int64, device))?,
            Tensor::f_zeros([0, r], (Kind::Float, device))?,
            0,
        )
    } else {
        let streams = PromptStream::consecutive(params.seed, part.start, part.len());
        let own_images = images.get(part.clone()).unwrap_or(&[]);
        let out = generate_images(
            model,
            &prompts[part.clone()],
            own_images,
            &streams,
            params,
            stop,
            Some(width),
        )?;
        let (ints, floats) = pack(&out, part.start)?;
        (ints, floats, out.decoded_rows)
    };
    let counts = Tensor::from_slice(&[ints.size()[0], decoded as i64]).to_device(device);
    let counts = gather_rows(peers, &counts.f_unsqueeze(0)?, None)?;
    let rows: Vec<i64> = counts.iter().map(|t| t.int64_value(&[0, 0])).collect();
    let decoded_rows = counts.iter().map(|t| t.int64_value(&[0, 1]) as usize).sum();
    let ints = Tensor::f_cat(&gather_rows(peers, &ints, Some(&rows))?, 0)?;
    let floats = Tensor::f_cat(&gather_rows(peers, &floats, Some(&rows))?, 0)?;
    unpack(&ints, &floats, (p, r, axes), decoded_rows)
}

fn join<D: Decoder>(
    model: &D,
    peers: &ProcessGroup,
    prompts: &[Vec<i64>],
    images: &[RowImages],
    params: &SamplingParams,
    stop: &StopTokens,
) -> Result<RolloutOutput, RolloutError> {
    // Each member's seed, prompt count, prompt lengths and tokens, then each prompt's image
    // count and each image's grid and pixel count, as one flat list; the pixels in another.
    let mut mine = vec![params.seed as i64, prompts.len() as i64];
    mine.extend(prompts.iter().map(|p| p.len() as i64));
    mine.extend(prompts.iter().flatten());
    let mut pixels: Vec<f32> = Vec::new();
    for i in 0..prompts.len() {
        let own = images.get(i).map_or(&[][..], |r| &r[..]);
        mine.push(own.len() as i64);
        for image in own {
            mine.extend(image.grid_thw);
            mine.push(image.pixel_values.len() as i64);
            pixels.extend_from_slice(&image.pixel_values);
        }
    }
    let device = model.device();
    let len = Tensor::from_slice(&[mine.len() as i64]).to_device(device);
    let lens = gather_rows(peers, &len.f_unsqueeze(0)?, None)?;
    let lens: Vec<i64> = lens.iter().map(|t| t.int64_value(&[0, 0])).collect();
    let longest = lens.iter().copied().max().unwrap_or(0);
    let row = Tensor::f_zeros([1, longest], (Kind::Int64, device))?;
    row.f_narrow(1, 0, mine.len() as i64)?
        .f_copy_(&Tensor::from_slice(&mine).to_device(device))?;
    let lists = gather_rows(peers, &row, None)?;
    let all_pixels = gather_floats(peers, &pixels, device)?;

    let (mut union, mut streams, mut first_prompt) = (Vec::new(), Vec::new(), 0);
    let mut union_images: Vec<RowImages> = Vec::new();
    for (member, (list, member_pixels)) in lists.iter().zip(&all_pixels).enumerate() {
        let list = Vec::<i64>::try_from(list.f_flatten(0, -1)?.f_to_device(Device::Cpu)?)?;
        let bad = || dist(format!("member {member} sent a malformed prompt list"));
        let (&[seed, count], rest) = list.split_first_chunk::<2>().ok_or_else(bad)?;
        let (seed, count) = (seed as u64, usize::try_from(count).map_err(|_| bad())?);
        if rest.len() < count {
            return Err(bad());
        }
        let (lengths, mut tokens) = rest.split_at(count);
        if member == peers.rank() {
            first_prompt = union.len();
        }
        for (i, &l) in lengths.iter().enumerate() {
            let (prompt, rest) = tokens
                .split_at_checked(usize::try_from(l).map_err(|_| bad())?)
                .ok_or_else(bad)?;
            union.push(prompt.to_vec());
            streams.push(PromptStream {
                seed,
                index: i as u64,
            });
            tokens = rest;
        }
        // The images of this member's prompts, their pixels in order.
        let mut at = 0usize;
        for _ in 0..count {
            let (&n, rest) = tokens.split_first().ok_or_else(bad)?;
            tokens = rest;
            let mut row = Vec::new();
            for _ in 0..n {
                let (&[t, h, w, len], rest) = tokens.split_first_chunk::<4>().ok_or_else(bad)?;
                tokens = rest;
                let len = usize::try_from(len).map_err(|_| bad())?;
                let values = member_pixels.get(at..at + len).ok_or_else(bad)?;
                at += len;
                row.push(ProcessedImage {
                    pixel_values: values.to_vec(),
                    grid_thw: [t, h, w],
                    seconds_per_grid: None,
                    timestamps: Vec::new(),
                });
            }
            union_images.push(row.into());
        }
    }
    if union_images.iter().all(|r| r.is_empty()) {
        union_images.clear();
    }
    let out = generate_images(model, &union, &union_images, &streams, params, stop, None)?;
    rows_of(&out, first_prompt, prompts.len(), params.n)
}

/// Every member's `values` in member order (collective over `group`; lengths may differ).
fn gather_floats(
    group: &ProcessGroup,
    values: &[f32],
    device: Device,
) -> Result<Vec<Vec<f32>>, RolloutError> {
    let len = Tensor::from_slice(&[values.len() as i64]).to_device(device);
    let lens: Vec<i64> = gather_rows(group, &len.f_unsqueeze(0)?, None)?
        .iter()
        .map(|t| t.int64_value(&[0, 0]))
        .collect();
    let longest = lens.iter().copied().max().unwrap_or(0);
    if longest == 0 {
        return Ok(vec![Vec::new(); lens.len()]);
    }
    let row = Tensor::f_zeros([1, longest], (Kind::Float, device))?;
    if !values.is_empty() {
        row.f_narrow(1, 0, values.len() as i64)?
            .f_copy_(&Tensor::from_slice(values).to_device(device))?;
    }
    gather_rows(group, &row, None)?
        .iter()
        .zip(&lens)
        .map(|(t, &n)| {
            Ok(Vec::<f32>::try_from(
                t.f_flatten(0, -1)?
                    .f_narrow(0, 0, n)?
                    .f_to_device(Device::Cpu)?,
            )?)
        })
        .collect()
}

/// The int64 columns of an output row: prompt, response, attention mask, positions (`axes`
/// per token), response mask, then length, finished and prompt index.
fn packed_width(p: i64, r: i64, axes: i64) -> i64 {
    p + r + (1 + axes) * (p + r) + r + 3
}

/// One output as an int64 (rows, [`packed_width`]) and an f32 (rows, R) tensor; prompt
/// indices shifted by `first_prompt`.
fn pack(out: &RolloutOutput, first_prompt: usize) -> Result<(Tensor, Tensor), RolloutError> {
    let device = out.prompts.device();
    let column = |v: Vec<i64>| Tensor::from_slice(&v).to_device(device).unsqueeze(1);
    let ints = Tensor::f_cat(
        &[
            out.prompts.shallow_clone(),
            out.responses.shallow_clone(),
            out.attention_mask.shallow_clone(),
            // A vision-language model's `(rows, T, 3)` flattened per row.
            out.position_ids.f_flatten(1, -1)?,
            out.response_mask.shallow_clone(),
            column(out.response_lengths.iter().map(|&l| l as i64).collect()),
            column(out.finished.iter().map(|&f| i64::from(f)).collect()),
            column(
                out.prompt_index
                    .iter()
                    .map(|&i| (i + first_prompt) as i64)
                    .collect(),
            ),
        ],
        1,
    )?;
    Ok((ints, out.rollout_log_probs.shallow_clone()))
}

fn unpack(
    ints: &Tensor,
    floats: &Tensor,
    (p, r, axes): (i64, i64, i64),
    decoded_rows: usize,
) -> Result<RolloutOutput, RolloutError> {
    let mut at = 0;
    let mut take = |w: i64| -> Result<Tensor, RolloutError> {
        let t = ints.f_narrow(1, at, w)?.f_contiguous()?;
        at += w;
        Ok(t)
    };
    let prompts = take(p)?;
    let responses = take(r)?;
    let attention_mask = take(p + r)?;
    let position_ids = take(axes * (p + r))?;
    let position_ids = if axes > 1 {
        position_ids.f_view([-1, p + r, axes])?
    } else {
        position_ids
    };
    let response_mask = take(r)?;
    let cpu = |t: Tensor| -> Result<Vec<i64>, RolloutError> {
        Ok(Vec::<i64>::try_from(
            t.f_flatten(0, -1)?.f_to_device(Device::Cpu)?,
        )?)
    };
    let lengths = cpu(take(1)?)?;
    let finished = cpu(take(1)?)?;
    let prompt_index = cpu(take(1)?)?;
    Ok(RolloutOutput {
        input_ids: Tensor::f_cat(&[&prompts, &responses], 1)?,
        prompts,
        responses,
        attention_mask,
        position_ids,
        response_mask,
        rollout_log_probs: floats.shallow_clone(),
        response_lengths: lengths.iter().map(|&l| l as usize).collect(),
        finished: finished.iter().map(|&f| f != 0).collect(),
        prompt_index: prompt_index.iter().map(|&i| i as usize).collect(),
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

/// The rows of `count` prompts starting at prompt `first` of `out` (`n` rows per prompt),
/// with prompt indices counted from `first`.
fn rows_of(
    out: &RolloutOutput,
    first: usize,
    count: usize,
    n: usize,
) -> Result<RolloutOutput, RolloutError> {
    let (start, len) = (first * n, count * n);
    let rows = |t: &Tensor| t.f_narrow(0, start as i64, len as i64);
    let range = start..start + len;
    Ok(RolloutOutput {
        prompts: rows(&out.prompts)?,
        responses: rows(&out.responses)?,
        input_ids: rows(&out.input_ids)?,
        attention_mask: rows(&out.attention_mask)?,
        position_ids: rows(&out.position_ids)?,
        response_mask: rows(&out.response_mask)?,
        rollout_log_probs: rows(&out.rollout_log_probs)?,
        response_lengths: out.response_lengths[range.clone()].to_vec(),
        finished: out.finished[range.clone()].to_vec(),
        prompt_index: out.prompt_index[range].iter().map(|&i| i - first).collect(),
        decoded_rows: out.decoded_rows,
        num_turns: Vec::new(),
        tool_calls: Vec::new(),
        tool_failures: Vec::new(),
        tool_rewards: Vec::new(),
        turn_scores: Vec::new(),
        loop_scores: Vec::new(),
        versions: Vec::new(),
    })
}

/// Every member's `t` (rows, cols) in member order (collective over `group`). `rows` gives each
/// member's row count when known; otherwise every member sends as many rows as this one.
fn gather_rows(
    group: &ProcessGroup,
    t: &Tensor,
    rows: Option<&[i64]>,
) -> Result<Vec<Tensor>, RolloutError> {
    let (mine, cols) = (t.size()[0], t.size()[1]);
    let size = group.size();
    let rows = rows.map_or_else(|| vec![mine; size], <[i64]>::to_vec);
    let most = rows.iter().copied().max().unwrap_or(0);
    if most == 0 || cols == 0 {
        return Ok(rows
            .iter()
            .map(|_| t.f_narrow(0, 0, 0))
            .collect::<Result<_, _>>()?);
    }
    let padded = Tensor::f_zeros([most, cols], (t.kind(), t.device()))?;
    padded.f_narrow(0, 0, mine)?.f_copy_(t)?;
    let out = Tensor::f_empty([size as i64, most, cols], (t.kind(), t.device()))?;
    group.all_gather_into(&out, &padded).map_err(dist)?;
    rows.iter()
        .enumerate()
        .map(|(m, &n)| Ok(out.f_select(0, m as i64)?.f_narrow(0, 0, n)?))
        .collect()
}
