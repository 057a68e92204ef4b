//! A vision-language prompt as verl 0.9 builds it for Qwen-VL models: the row's messages with
//! their `<image>` placeholders turned into content parts (the dataset's `_build_messages`),
//! rendered by the chat template with the generation prompt (each image part becomes the
//! template's vision span, `<|vision_start|><|image_pad|><|vision_end|>` for Qwen-VL), then each
//! image pad repeated once per merged patch of its image, in order (the processor's expansion),
//! and tokenized.

use serde_json::{Map, Value, json};

use crate::tokenizer::{Message, Tokenizer, TokenizerError};

use super::image::{
    ImageProcessorConfig, ProcessedImage, image_from_cell, process_image, tokens_fetched_with,
};
use super::video::{ProcessedVideo, VideoOptions, VideoProcessor, VideoSource, process_video};

/// The placeholder verl's datasets put in a prompt's text where an image goes.
pub const IMAGE_PLACEHOLDER: &str = "<image>";

/// The image token of Qwen-VL processors.
pub const IMAGE_PAD: &str = "<|image_pad|>";

/// The placeholder verl's datasets put in a prompt's text where a video goes.
pub const VIDEO_PLACEHOLDER: &str = "<video>";

/// The video token of Qwen-VL processors.
pub const VIDEO_PAD: &str = "<|video_pad|>";

/// The tokens around a vision span of Qwen-VL prompts.
pub const VISION_START: &str = "<|vision_start|>";
pub const VISION_END: &str = "<|vision_end|>";

/// How the processor writes a video's tokens into the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VideoSpans {
    /// Qwen2.5-VL's: the video pad once per merged patch of the whole video, in one span.
    Whole,
    /// Qwen3-VL's: each temporal patch in a vision span of its own, behind its timestamp
    /// (`<0.2 seconds><|vision_start|>` pads `<|vision_end|>`).
    PerFrame,
}

impl VideoSpans {
    /// The layout of a processor whose videos are `timestamped` (or not).
    pub fn of(timestamped: bool) -> Self {
        if timestamped {
            VideoSpans::PerFrame
        } else {
            VideoSpans::Whole
        }
    }
}

/// Why a vision prompt cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum VisionPromptError {
    #[error("the prompt has {placeholders} `<image>` placeholder(s) for {images} image(s)")]
    Count { placeholders: usize, images: usize },
    #[error("the prompt has {placeholders} `<video>` placeholder(s) for {videos} video(s)")]
    VideoCount { placeholders: usize, videos: usize },
    #[error("the chat template rendered {pads} image token(s) `{IMAGE_PAD}` for {images} image(s)")]
    Pads { pads: usize, images: usize },
    #[error(
        "the chat template rendered {pads} video token(s) `{VIDEO_PAD}` for {videos} video(s) (does it render video parts?)"
    )]
    VideoPads { pads: usize, videos: usize },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{0}")]
    Row(String),
    #[error(transparent)]
    Image(#[from] super::image::ImageError),
}

/// verl's `_build_messages`: with images, each text content is split at its `<image>`
/// placeholders into `{"type": "text"}` and `{"type": "image"}` parts (empty text dropped);
/// the placeholders must match the images one to one. Without images nothing changes.
pub fn split_placeholders(
    messages: &[Message],
    images: usize,
) -> Result<Vec<Message>, VisionPromptError> {
    split_visual_placeholders(messages, images, 0)
}

/// [`split_placeholders`] of `<image>` and `<video>` placeholders (verl splits at both:
/// `{"type": "video"}` parts for the second), each matching its own list one to one.
pub fn split_visual_placeholders(
    messages: &[Message],
    images: usize,
    videos: usize,
) -> Result<Vec<Message>, VisionPromptError> {
    if images == 0 && videos == 0 {
        return Ok(messages.to_vec());
    }
    let (mut used_images, mut used_videos) = (0, 0);
    let out = messages
        .iter()
        .map(|m| {
            let Value::String(text) = &m.content else {
                // Content already in parts (a Python dataset's messages): its image parts.
                if let Value::Array(parts) = &m.content {
                    used_images += parts.iter().filter(|p| is_image_part(p)).count();
                    used_videos += parts
                        .iter()
                        .filter(|p| p.get("type").and_then(Value::as_str) == Some("video"))
                        .count();
                }
                return m.clone();
            };
            let mut parts = Vec::new();
            let mut rest = text.as_str();
            loop {
                let next = [IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER]
                    .iter()
                    .filter_map(|p| rest.find(p).map(|at| (at, *p)))
                    .min();
                let Some((at, placeholder)) = next else {
                    break;
                };
                if at > 0 {
                    parts.push(json!({"type": "text", "text": &rest[..at]}));
                }
                if placeholder == IMAGE_PLACEHOLDER {
                    parts.push(json!({"type": "image"}));
                    used_images += 1;
                } else {
                    parts.push(json!({"type": "video"}));
                    used_videos += 1;
                }
                rest = &rest[at + placeholder.len()..];
            }
            if !rest.is_empty() {
                parts.push(json!({"type": "text", "text": rest}));
            }
            let mut m = m.clone();
            m.content = Value::Array(parts);
            m
        })
        .collect();
    if used_images != images {
        return Err(VisionPromptError::Count {
            placeholders: used_images,
            images,
        });
    }
    if used_videos != videos {
        return Err(VisionPromptError::VideoCount {
            placeholders: used_videos,
            videos,
        });
    }
    Ok(out)
}

/// A content part that stands for an image (`{"type": "image", ...}`).
fn is_image_part(part: &Value) -> bool {
    part.get("type").and_then(Value::as_str) == Some("image")
}

/// A Python dataset's item (verl's `RLHFDataset.__getitem__`): its messages in `prompt_key`
/// carry their images inline, each an `{"type": "image", "image": <picture>, ...}` part (the
/// picture as an image cell: the helper writes a PIL image as `{"bytes"}`). Each part's
/// picture moves, in order, to the item's `image_key` column (what the data files hold) and
/// the part becomes a bare `{"type": "image"}`. Items without image parts are unchanged.
pub fn lift_inline_images(
    row: &mut Map<String, Value>,
    (prompt_key, image_key): (&str, &str),
) -> Result<(), String> {
    let Some(Value::Array(messages)) = row.get_mut(prompt_key) else {
        return Ok(());
    };
    let mut cells = Vec::new();
    for m in messages.iter_mut() {
        let Some(Value::Array(parts)) = m.get_mut("content") else {
            continue;
        };
        for part in parts.iter_mut().filter(|p| is_image_part(p)) {
            let Value::Object(fields) = std::mem::replace(part, json!({"type": "image"})) else {
                continue;
            };
            let cell = match fields.get("image") {
                Some(inner @ (Value::Object(_) | Value::String(_))) => inner.clone(),
                // verl's own part keys: the row's `{"bytes", "path"}` spread into the part.
                _ => Value::Object(
                    fields
                        .into_iter()
                        .filter(|(k, _)| k != "type" && k != "image")
                        .collect(),
                ),
            };
            cells.push(cell);
        }
    }
    if cells.is_empty() {
        return Ok(());
    }
    if row.get(image_key).is_some_and(|v| match v {
        Value::Array(a) => !a.is_empty(),
        v => !v.is_null(),
    }) {
        return Err(format!(
            "the item's messages carry {} image(s) and its `{image_key}` column holds images too: verl's dataset pops the column into the messages",
            cells.len()
        ));
    }
    row.insert(image_key.to_owned(), Value::Array(cells));
    Ok(())
}

/// The prompt's token ids (module docs): `messages` as written in the row (with `<image>`
/// placeholders) and its images, prepared ([`super::image::process_image`]).
pub fn encode_vision_prompt(
    tok: &Tokenizer,
    messages: &[Message],
    images: &[ProcessedImage],
    merge_size: usize,
    kwargs: &Map<String, Value>,
) -> Result<Vec<i64>, VisionPromptError> {
    encode_visual_prompt(
        tok,
        messages,
        (images, &[]),
        (merge_size, VideoSpans::Whole),
        kwargs,
    )
    .map(|(ids, _)| ids)
}

/// [`encode_vision_prompt`] with videos (`<video>` placeholders, `{"type": "video"}` parts,
/// each video pad of the rendered template repeated once per merged patch of its video, as
/// the processor expands them): the ids and the images and videos in the order the prompt
/// holds them (the order the model fills its placeholders in).
pub fn encode_visual_prompt(
    tok: &Tokenizer,
    messages: &[Message],
    (images, videos): (&[ProcessedImage], &[ProcessedImage]),
    (merge_size, spans): (usize, VideoSpans),
    kwargs: &Map<String, Value>,
) -> Result<(Vec<i64>, Vec<ProcessedImage>), VisionPromptError> {
    let messages = split_visual_placeholders(messages, images.len(), videos.len())?;
    let text = tok.apply_chat_template(&messages, true, kwargs)?;
    let pads = text.matches(IMAGE_PAD).count();
    if pads != images.len() {
        return Err(VisionPromptError::Pads {
            pads,
            images: images.len(),
        });
    }
    let video_pads = text.matches(VIDEO_PAD).count();
    if video_pads != videos.len() {
        return Err(VisionPromptError::VideoPads {
            pads: video_pads,
            videos: videos.len(),
        });
    }
    let mut expanded = String::with_capacity(text.len());
    let mut order = Vec::with_capacity(images.len() + videos.len());
    let (mut next_image, mut next_video) = (images.iter(), videos.iter());
    let mut rest = text.as_str();
    loop {
        let next = [IMAGE_PAD, VIDEO_PAD]
            .iter()
            .filter_map(|p| rest.find(p).map(|at| (at, *p)))
            .min();
        let Some((at, pad)) = next else {
            break;
        };
        expanded.push_str(&rest[..at]);
        let item = if pad == IMAGE_PAD {
            next_image.next()
        } else {
            next_video.next()
        };
        rest = &rest[at + pad.len()..];
        // The counts were checked above.
        let Some(item) = item else { continue };
        order.push(item.clone());
        if pad == VIDEO_PAD && spans == VideoSpans::PerFrame {
            // The processor replaces the template's whole vision span (or the bare pad).
            let span = expanded.ends_with(VISION_START) && rest.starts_with(VISION_END);
            if span {
                expanded.truncate(expanded.len() - VISION_START.len());
                rest = &rest[VISION_END.len()..];
            }
            let per_frame = item.tokens(merge_size) / item.grid_thw[0].max(1) as usize;
            if item.timestamps.len() != item.grid_thw[0].max(0) as usize {
                return Err(VisionPromptError::Row(
                    "a video without a timestamp for each temporal patch".into(),
                ));
            }
            for second in &item.timestamps {
                expanded.push_str(&format!("<{second:.1} seconds>{VISION_START}"));
                expanded.push_str(&pad.repeat(per_frame));
                expanded.push_str(VISION_END);
            }
        } else {
            expanded.push_str(&pad.repeat(item.tokens(merge_size)));
        }
    }
    expanded.push_str(rest);
    Ok((tok.encode(&expanded, false)?, order))
}

/// A row's prompt: its ids (image placeholders expanded), its images, and its length as
/// verl's dataset measures it for `filter_overlong_prompts`.
#[derive(Debug)]
pub struct RowPrompt {
    pub ids: Vec<i64>,
    pub images: Vec<ProcessedImage>,
    /// `ids.len()` with each image's and video's placeholders counted as fetched with the
    /// dataset's patch size (`data.image_patch_size`) instead of the processor's.
    pub measured_len: usize,
}

/// A row of verl's multimodal RL data (geo3k's layout: a chat `prompt_key` column with
/// `<image>` placeholders, an `image_key` column of image cells): its prompt ids and images,
/// and its length measured with images and videos fetched on `measure_patch`-pixel patches.
/// A cell's own `min_pixels`/`max_pixels` bound its first resize, as qwen_vl_utils reads them.
pub fn row_prompt(
    row: &Map<String, Value>,
    (prompt_key, image_key): (&str, &str),
    tok: &Tokenizer,
    (cfg, video, measure_patch): (&ImageProcessorConfig, VideoProcessor, usize),
    kwargs: &Map<String, Value>,
) -> Result<RowPrompt, VisionPromptError> {
    let messages: Vec<Message> = match row.get(prompt_key) {
        Some(v @ Value::Array(_)) => serde_json::from_value(v.clone()).map_err(|e| {
            VisionPromptError::Row(format!("column `{prompt_key}` is not a chat: {e}"))
        })?,
        _ => {
            return Err(VisionPromptError::Row(format!(
                "column `{prompt_key}` must be a list of chat messages"
            )));
        }
    };
    let cells = match row.get(image_key) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(cells)) => cells.clone(),
        Some(other) => {
            return Err(VisionPromptError::Row(format!(
                "column `{image_key}` must be a list of images, got {other}"
            )));
        }
    };
    // The dataset's fetch differs from the rollout's only when the patch sizes do.
    let remeasure = measure_patch != cfg.patch_size;
    let mut images = Vec::with_capacity(cells.len());
    let mut measured_tokens = 0;
    for cell in &cells {
        let bound = |k: &str| cell.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let fetch = (bound("min_pixels"), bound("max_pixels"));
        let img = image_from_cell(cell)?;
        if remeasure {
            measured_tokens +=
                tokens_fetched_with((img.height, img.width), measure_patch, fetch, cfg)?;
        }
        images.push(process_image(&img, fetch, cfg)?);
    }
    let videos = match row.get(VIDEO_KEY) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(cells)) => cells
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                let at = |e: String| {
                    VisionPromptError::Row(format!("column `{VIDEO_KEY}`, video {i}: {e}"))
                };
                let (prepared, opts) =
                    video_from_cell(cell, cfg, video).map_err(|e| at(e.to_string()))?;
                if remeasure {
                    measured_tokens += prepared
                        .tokens_fetched_with(measure_patch, &opts, cfg, video)
                        .map_err(|e| at(e.to_string()))?;
                }
                Ok::<_, VisionPromptError>(prepared.video)
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(VisionPromptError::Row(format!(
                "column `{VIDEO_KEY}` must be a list of videos, got {other}"
            )));
        }
    };
    let placed: usize = images
        .iter()
        .chain(&videos)
        .map(|i| i.tokens(cfg.merge_size))
        .sum();
    let (ids, visuals) = encode_visual_prompt(
        tok,
        &messages,
        (&images, &videos),
        (cfg.merge_size, VideoSpans::of(video.timestamped())),
        kwargs,
    )?;
    // The same prompt with each image's and video's placeholders as the dataset's fetch
    // makes them (a Qwen3-VL video's timestamps and spans do not depend on it).
    let measured_len = if remeasure {
        ids.len() - placed + measured_tokens
    } else {
        ids.len()
    };
    Ok(RowPrompt {
        ids,
        images: visuals,
        measured_len,
    })
}

/// verl's `data.video_key` (its default; another value is refused at build).
pub const VIDEO_KEY: &str = "videos";

/// A video cell as verl's dataset reads it for Qwen-VL models, prepared
/// ([`super::video::process_video`]): a list of frames (each an image cell), a video file's
/// path (`file://` allowed), or `{"video": frames or path, ...}` with qwen_vl_utils' keys
/// ([`VideoOptions`]); with the cell's options.
fn video_from_cell(
    cell: &Value,
    cfg: &ImageProcessorConfig,
    video: VideoProcessor,
) -> Result<(ProcessedVideo, VideoOptions), VisionPromptError> {
    let row = |why: String| VisionPromptError::Row(why);
    let source = |v: &Value| -> Result<VideoSource, VisionPromptError> {
        match v {
            Value::Array(frames) => Ok(VideoSource::Frames(
                frames
                    .iter()
                    .map(image_from_cell)
                    .collect::<Result<Vec<_>, _>>()?,
            )),
            Value::String(path) if path.contains("://") && !path.starts_with("file://") => {
                Err(row(format!(
                    "{path}: verlc reads local video files (a path or file://)"
                )))
            }
            Value::String(path) => Ok(VideoSource::File(
                path.strip_prefix("file://").unwrap_or(path).into(),
            )),
            other => Err(row(format!(
                "a video is a list of frames or a file's path, got {other}"
            ))),
        }
    };
    let (source, opts) = match cell {
        Value::Object(fields) => {
            let video = fields
                .get("video")
                .ok_or_else(|| row("a video cell's object needs its `video`".into()))?;
            let opts = VideoOptions::of_cell(fields, video.is_string()).map_err(row)?;
            (source(video)?, opts)
        }
        other => (source(other)?, VideoOptions::default()),
    };
    Ok((
        process_video(&source, &opts, cfg.patch_size, cfg, video)?,
        opts,
    ))
}
