//! Videos of vision-language rows, as verl prepares them for Qwen-VL models: its
//! `process_video` hands the row's video to qwen_vl_utils' `fetch_video`, which takes a video
//! as a list of frames or a file.
//!
//! - A frame list: every frame fetched as an image (`fetch_image`: Pillow's bicubic resize,
//!   [`super::image`], to multiples of four patches: `fetch_video` passes its factor where
//!   `fetch_image` takes a patch size), the count padded to an even number with the last frame.
//! - A file ([`super::video_file`]): an even number of frames sampled from the cell's time
//!   range (two a second by default), decoded to 8-bit RGB.
//!
//! Then the stack is resized with torchvision's antialiased bicubic filter within the video's
//! pixel bounds (at least 128 and at most 768 merged patches a frame, all frames within a
//! whole-video budget), back to 8-bit values; transformers' `Qwen2VLVideoProcessor` resizes to
//! its own bounds (the same ones: a no-op), rescales and normalises in one step (mean and std
//! scaled by 255) and cuts patches of `temporal_patch_size` frames.
//!
//! Qwen3-VL's `Qwen3VLVideoProcessor` bounds the whole video instead (frames × pixels within
//! its `size`, from `video_preprocessor_config.json`), which is not a no-op, and its processor
//! writes each temporal patch into the prompt apart, behind its timestamp (from the frames'
//! times in the source: [`ProcessedImage::timestamps`]).
//!
//! The stack's resize is libtorch's own `_upsample_bicubic2d_aa`, the kernel torchvision
//! calls, so the frames equal verl's bit for bit.

use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};

use super::image::{
    FetchPixels, ImageError, ImageProcessorConfig, ResizeRule, RgbImage, fetched_size,
    resize_bicubic, smart_resize,
};
use super::video_file::{VideoSampling, read_video_file};
use crate::model::vision::ProcessedImage;

/// qwen_vl_utils' frame factor: a video's frame count is padded (a frame list) or sampled (a
/// file) to a multiple of it.
pub(super) const FRAME_FACTOR: usize = 2;
/// qwen_vl_utils' bounds of a video frame, in merged patches.
const VIDEO_MIN_TOKENS: usize = 128;
const VIDEO_MAX_TOKENS: usize = 768;
/// qwen_vl_utils' whole-video budget: `MODEL_SEQ_LEN` (128000) × factor² × 0.9 pixels.
const MODEL_SEQ_LEN: f64 = 128_000.0;
/// The frame rate a frame list is taken to be sampled at (qwen_vl_utils' `sample_fps`), and
/// the one Qwen2.5-VL's processor counts when not given one (verl gives none).
const SAMPLE_FPS: f64 = 2.0;

/// A model's video processor: how it sizes a video (and how the prompt holds it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VideoProcessor {
    /// transformers' `Qwen2VLVideoProcessor` (Qwen2.5-VL): each frame within 128 to 768
    /// merged patches; the video's tokens in one vision span.
    Qwen2Vl,
    /// `Qwen3VLVideoProcessor` (Qwen3-VL, Qwen3.5): the whole video, frames × pixels, within
    /// `size` (`shortest_edge`, `longest_edge`); each temporal patch in a vision span of its
    /// own behind its timestamp.
    Qwen3Vl {
        min_pixels: usize,
        max_pixels: usize,
    },
}

impl VideoProcessor {
    /// `Qwen3VLVideoProcessor`'s class defaults of `size` (`shortest_edge`, `longest_edge`).
    const QWEN3_VL_SIZE: (usize, usize) = (128 * 32 * 32, 768 * 32 * 32);

    /// `Qwen3VLVideoProcessor` with its class defaults (a model directory without
    /// `video_preprocessor_config.json`, a built-in model).
    pub const QWEN3_VL_DEFAULT: VideoProcessor = VideoProcessor::Qwen3Vl {
        min_pixels: Self::QWEN3_VL_SIZE.0,
        max_pixels: Self::QWEN3_VL_SIZE.1,
    };

    /// The video processor of a model with `tower` (towers with timestamped videos take
    /// Qwen3-VL's), its `size` from `dir`'s `video_preprocessor_config.json` when it has one.
    pub fn of_model(
        tower: Option<verlc_spec::families::VisionTower>,
        dir: Option<&std::path::Path>,
    ) -> Result<Self, String> {
        if !tower.is_some_and(|t| t.timestamped_videos()) {
            return Ok(VideoProcessor::Qwen2Vl);
        }
        let Some(file) = dir
            .map(|d| d.join("video_preprocessor_config.json"))
            .filter(|f| f.is_file())
        else {
            return Ok(Self::QWEN3_VL_DEFAULT);
        };
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let (default_min, default_max) = Self::QWEN3_VL_SIZE;
        let edge = |k: &str, default: usize| match v.get("size").and_then(|s| s.get(k)) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(x) => x.as_u64().map(|x| x as usize).ok_or_else(|| {
                format!(
                    "{}: `size.{k}` must be a whole number of pixels, got {x}",
                    file.display()
                )
            }),
        };
        Ok(VideoProcessor::Qwen3Vl {
            min_pixels: edge("shortest_edge", default_min)?,
            max_pixels: edge("longest_edge", default_max)?,
        })
    }

    /// Its settings as transformers reads them (`video_preprocessor_config.json` in `dir`),
    /// with `cfg`'s patches and normalisation: for a server whose processor must prepare
    /// verlc's frames as verlc did (the vLLM rollout). Frames come already sampled.
    pub fn save(self, dir: &std::path::Path, cfg: &ImageProcessorConfig) -> Result<(), String> {
        let (min_pixels, max_pixels) = self.bounds(cfg.patch_size * cfg.merge_size);
        let class = match self {
            VideoProcessor::Qwen2Vl => "Qwen2VLVideoProcessor",
            VideoProcessor::Qwen3Vl { .. } => "Qwen3VLVideoProcessor",
        };
        let mut doc = cfg.processor_fields();
        doc.extend([
            ("video_processor_type".into(), serde_json::json!(class)),
            (
                "size".into(),
                serde_json::json!({"shortest_edge": min_pixels, "longest_edge": max_pixels}),
            ),
            ("min_pixels".into(), serde_json::json!(min_pixels)),
            ("max_pixels".into(), serde_json::json!(max_pixels)),
            ("do_sample_frames".into(), serde_json::json!(false)),
        ]);
        let out = dir.join("video_preprocessor_config.json");
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(&out, text).map_err(|e| format!("{}: {e}", out.display()))
    }

    /// The pixel bounds the processor resizes within (`factor`: pixels per merged patch side):
    /// Qwen2.5-VL's of each frame, 128 to 768 merged patches; Qwen3-VL's of the whole video.
    fn bounds(self, factor: usize) -> (usize, usize) {
        match self {
            VideoProcessor::Qwen2Vl => (128 * factor * factor, 768 * factor * factor),
            VideoProcessor::Qwen3Vl {
                min_pixels,
                max_pixels,
            } => (min_pixels, max_pixels),
        }
    }

    /// Whether the prompt holds each temporal patch apart, behind its timestamp.
    pub fn timestamped(self) -> bool {
        matches!(self, VideoProcessor::Qwen3Vl { .. })
    }

    /// The height and width the processor resizes `frames` frames of `height` × `width` to
    /// (`factor`: pixels per merged patch side).
    fn size(
        self,
        frames: usize,
        (height, width): (usize, usize),
        factor: usize,
        temporal_patch: usize,
    ) -> Result<(usize, usize), ImageError> {
        let (min_pixels, max_pixels) = self.bounds(factor);
        match self {
            VideoProcessor::Qwen2Vl => smart_resize(
                height,
                width,
                factor,
                (min_pixels as f64, max_pixels as f64),
                ResizeRule::Transformers,
            ),
            VideoProcessor::Qwen3Vl { .. } => video_smart_resize(
                frames,
                (height, width),
                (temporal_patch, factor),
                (min_pixels, max_pixels),
            ),
        }
    }
}

/// `Qwen3VLVideoProcessor`'s resize rule: height and width rounded to `factor`, scaled (keeping
/// the aspect) until frames × height × width (frames rounded to `temporal`) lies within the
/// bounds.
fn video_smart_resize(
    frames: usize,
    (height, width): (usize, usize),
    (temporal, factor): (usize, usize),
    (min_pixels, max_pixels): (usize, usize),
) -> Result<(usize, usize), ImageError> {
    let bad = |why: String| ImageError::Video(why);
    if frames < temporal {
        return Err(bad(format!(
            "{frames} frame(s), fewer than a temporal patch ({temporal})"
        )));
    }
    if height < factor || width < factor {
        return Err(bad(format!(
            "frames of {width} x {height} pixels, smaller than a merged patch ({factor} pixels)"
        )));
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        return Err(ImageError::AspectRatio(ratio));
    }
    // Python's round (half to even) of the quotients.
    let round = |x: f64, by: f64| ((x / by).round_ties_even() * by) as usize;
    let (hb, wb, tb) = (
        round(h, f),
        round(w, f),
        round(frames as f64, temporal as f64),
    );
    let n = frames as f64;
    Ok(if tb * hb * wb > max_pixels {
        let beta = (n * h * w / max_pixels as f64).sqrt();
        let floor = |x: f64| (((x / f).floor() * f) as usize).max(factor);
        (floor(h / beta), floor(w / beta))
    } else if tb * hb * wb < min_pixels {
        let beta = (min_pixels as f64 / (n * h * w)).sqrt();
        let ceil = |x: f64| ((x / f).ceil() * f) as usize;
        (ceil(h * beta), ceil(w * beta))
    } else {
        (hb, wb)
    })
}

/// The seconds Qwen3-VL's processor writes before each temporal patch of a video whose
/// frames lie at `frame_seconds`: the frames paired by the processor's `merge_size` (the last
/// repeated to fill a pair), each pair at the mean of its first and last frame's time; one per
/// temporal patch. Written `<{:.1} seconds>` (Rust's `{:.1}` rounds the exact binary value half
/// to even, as Python's does).
fn timestamps(frame_seconds: &[f64], merge_size: usize, grid_t: usize) -> Vec<f64> {
    let m = merge_size.max(1);
    let mut seconds = frame_seconds.to_vec();
    while !seconds.len().is_multiple_of(m) {
        seconds.push(seconds.last().copied().unwrap_or(0.0));
    }
    seconds
        .chunks(m)
        .map(|pair| (pair[0] + pair[pair.len() - 1]) / 2.0)
        .take(grid_t)
        .collect()
}

/// A video as the vision tower takes it, and the size of what was fetched (what another
/// fetch's size follows from).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedVideo {
    pub video: ProcessedImage,
    pub source: SourceSize,
}

/// A video's frames before the fetch resizes them: their count (padded to even), height and
/// width, and whether the fetch resizes each frame first (a frame list's, as images).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceSize {
    pub frames: usize,
    pub height: usize,
    pub width: usize,
    pub per_frame_fetch: bool,
}

impl ProcessedVideo {
    /// The placeholder tokens the same video takes when fetched with `fetch_patch`-pixel
    /// patches instead (within the cell's `opts`) before the processor `cfg`/`video`: verl's
    /// dataset measures a prompt for `filter_overlong_prompts` fetching with
    /// `data.image_patch_size`, its rollout with the processor's own patch size. Sizes only,
    /// no pixels: a video's grid follows from its frames' count and size.
    pub fn tokens_fetched_with(
        &self,
        fetch_patch: usize,
        opts: &VideoOptions,
        cfg: &ImageProcessorConfig,
        video: VideoProcessor,
    ) -> Result<usize, ImageError> {
        let s = self.source;
        let size = if s.per_frame_fetch {
            fetched_size((s.height, s.width), fetch_patch * 2, frame_bounds(opts)?)?
        } else {
            (s.height, s.width)
        };
        let [_, (ph, pw)] = stack_sizes(s.frames, size, fetch_patch, opts, cfg, video)?;
        let (p, m, t) = (
            cfg.patch_size,
            cfg.merge_size.max(1),
            cfg.temporal_patch_size.max(1),
        );
        Ok((s.frames / t) * (ph / p) * (pw / p) / (m * m))
    }
}

/// A row's video as its cell gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum VideoSource {
    /// Its frames, each an image.
    Frames(Vec<RgbImage>),
    /// A video file ([`super::video_file`]).
    File(PathBuf),
}

/// qwen_vl_utils' per-video keys that verlc reads from a `{"video": ..., ...}` cell: pixel
/// bounds (of each frame, and of all frames together), a frame list's frame rates, a file's
/// sampling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VideoOptions {
    pub min_pixels: Option<f64>,
    pub max_pixels: Option<f64>,
    pub total_pixels: Option<f64>,
    /// A frame list: the rate its frames were sampled at, and the source's rate (its
    /// timestamps count frames at this rate; `sample_fps` when absent).
    pub sample_fps: Option<f64>,
    pub raw_fps: Option<f64>,
    pub sampling: VideoSampling,
}

impl VideoOptions {
    const PIXEL_KEYS: [&'static str; 3] = ["min_pixels", "max_pixels", "total_pixels"];
    const FRAME_LIST_KEYS: [&'static str; 2] = ["sample_fps", "raw_fps"];

    /// The keys of a `{"video": ..., ...}` cell of a video `file` (else a frame list), `type`
    /// and `video` aside; any other key is refused, named, with the keys that apply.
    pub fn of_cell(
        fields: &serde_json::Map<String, serde_json::Value>,
        file: bool,
    ) -> Result<Self, String> {
        let own: &[&str] = if file {
            &VideoSampling::KEYS
        } else {
            &Self::FRAME_LIST_KEYS
        };
        let known = |k: &str| {
            k == "video" || k == "type" || Self::PIXEL_KEYS.contains(&k) || own.contains(&k)
        };
        if let Some(key) = fields.keys().find(|k| !known(k)) {
            let what = if file { "a video file" } else { "a frame list" };
            let mut keys: Vec<&str> = Self::PIXEL_KEYS.to_vec();
            keys.extend(own);
            return Err(format!(
                "`{key}` is not a key verlc reads for {what} (it reads {})",
                keys.iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let number = |k: &str| match fields.get(k) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Some)
                .ok_or_else(|| format!("`{k}` must be a positive number, got {v}")),
        };
        Ok(VideoOptions {
            min_pixels: number("min_pixels")?,
            max_pixels: number("max_pixels")?,
            total_pixels: number("total_pixels")?,
            sample_fps: number("sample_fps")?,
            raw_fps: number("raw_fps")?,
            sampling: if file {
                VideoSampling::of_cell(fields)?
            } else {
                VideoSampling::default()
            },
        })
    }
}

/// The frames of a video as qwen_vl_utils fetches them, before the stack's resize: 8-bit RGB,
/// `(frames, height, width, 3)` row-major, and each frame's time in seconds.
struct FetchedFrames {
    data: Vec<u8>,
    height: usize,
    width: usize,
    seconds: Vec<f64>,
    source: SourceSize,
}

/// A frame list fetched (each frame as `fetch_image` fetches an image, within the cell's pixel
/// bounds, at multiples of four patches: `fetch_video` passes its factor where `fetch_image`
/// takes a patch size), the count padded to an even number with the last frame; frame `i` at
/// `i / raw_fps` seconds.
fn fetch_frames(
    frames: &[RgbImage],
    fetch_patch: usize,
    opts: &VideoOptions,
) -> Result<FetchedFrames, ImageError> {
    let bad = |why: String| ImageError::Video(why);
    let first = frames.first().ok_or_else(|| bad("no frames".into()))?;
    let bounds = frame_bounds(opts)?;
    let frame_patch = fetch_patch * 2;
    let (h, w) = fetched_size((first.height, first.width), frame_patch, bounds)?;
    let mut fetched = Vec::with_capacity(frames.len() + 1);
    for (i, f) in frames.iter().enumerate() {
        let size = fetched_size((f.height, f.width), frame_patch, bounds)?;
        if size != (h, w) {
            return Err(bad(format!(
                "frame {i} fetches to {} x {} pixels, frame 0 to {w} x {h}: a video's frames share one size",
                size.1, size.0
            )));
        }
        fetched.push(resize_bicubic(f, w, h));
    }
    while !fetched.len().is_multiple_of(FRAME_FACTOR) {
        fetched.push(fetched[fetched.len() - 1].clone());
    }
    let raw_fps = opts.raw_fps.or(opts.sample_fps).unwrap_or(SAMPLE_FPS);
    Ok(FetchedFrames {
        source: SourceSize {
            frames: fetched.len(),
            height: first.height,
            width: first.width,
            per_frame_fetch: true,
        },
        seconds: (0..fetched.len()).map(|i| i as f64 / raw_fps).collect(),
        data: fetched.into_iter().flat_map(|f| f.data).collect(),
        height: h,
        width: w,
    })
}

/// The bounds a frame list's cell sets on each frame's fetch (whole numbers of pixels).
fn frame_bounds(opts: &VideoOptions) -> Result<FetchPixels, ImageError> {
    let whole = |k: &str, v: Option<f64>| match v {
        Some(x) if x.fract() != 0.0 => Err(ImageError::Video(format!(
            "`{k}` of a frame list bounds each frame too: a whole number of pixels, got {x}"
        ))),
        v => Ok(v.map(|x| x as usize)),
    };
    Ok((
        whole("min_pixels", opts.min_pixels)?,
        whole("max_pixels", opts.max_pixels)?,
    ))
}

/// A video file's sampled frames ([`read_video_file`]), frame `i` of the stream at
/// `i / fps` seconds.
fn fetch_file(path: &Path, opts: &VideoOptions) -> Result<FetchedFrames, ImageError> {
    let video = read_video_file(path, &opts.sampling)?;
    Ok(FetchedFrames {
        source: SourceSize {
            frames: video.indices.len(),
            height: video.height,
            width: video.width,
            per_frame_fetch: false,
        },
        seconds: video
            .indices
            .iter()
            .map(|&i| i as f64 / video.average_fps)
            .collect(),
        data: video.data,
        height: video.height,
        width: video.width,
    })
}

/// verl's preparation of a video (module docs): fetched with `fetch_patch` pixel patches
/// (`data.image_patch_size`, or the processor's in the rollout) within the cell's `opts`, then
/// the video processor `video` with the patches, normalisation and temporal patch of `cfg`.
pub fn process_video(
    source: &VideoSource,
    opts: &VideoOptions,
    fetch_patch: usize,
    cfg: &ImageProcessorConfig,
    video: VideoProcessor,
) -> Result<ProcessedVideo, ImageError> {
    let fetched = match source {
        VideoSource::Frames(frames) => fetch_frames(frames, fetch_patch, opts)?,
        VideoSource::File(path) => fetch_file(path, opts)?,
    };
    let (n, h, w) = (fetched.source.frames, fetched.height, fetched.width);
    let (p, m, t) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    let [(rh, rw), (ph, pw)] = stack_sizes(n, (h, w), fetch_patch, opts, cfg, video)?;
    let stack = Tensor::f_from_slice(&fetched.data)?
        .f_view([n as i64, h as i64, w as i64, 3])?
        .f_permute([0, 3, 1, 2])?
        .f_to_kind(Kind::Float)?;
    // torchvision's resize of an 8-bit stack: in float, clamped, rounded back to 8 bits.
    let stack = stack
        .f_internal_upsample_bicubic2d_aa([rh as i64, rw as i64], false, None, None)?
        .f_clamp(0.0, 255.0)?
        .f_round()?;
    // The processor's resize (in float, not rounded) to its bounds.
    let stack =
        stack.f_internal_upsample_bicubic2d_aa([ph as i64, pw as i64], false, None, None)?;
    // Rescale and normalise fused as transformers' fast processors do: (x - 255·mean) / (255·std)
    // in float32.
    let scale = |v: [f32; 3]| Tensor::from_slice(&v.map(|x| x * 255.0f32)).view([1, 3, 1, 1]);
    let stack = stack
        .f_sub(&scale(cfg.image_mean))?
        .f_div(&scale(cfg.image_std))?;
    // Patches: temporal groups, merge blocks, patches within a block; each patch channel,
    // frame, row, column.
    let frames_per_patch = t as i64;
    let (gt, gh, gw) = ((n / t) as i64, (ph / p) as i64, (pw / p) as i64);
    let (p, m) = (p as i64, m as i64);
    let patches = stack
        .f_view(&[gt, frames_per_patch, 3, gh / m, m, p, gw / m, m, p][..])?
        .f_permute([0, 3, 6, 4, 7, 2, 1, 5, 8])?
        .f_contiguous()?
        .f_view([-1])?
        .f_to_device(Device::Cpu)?;
    Ok(ProcessedVideo {
        video: ProcessedImage {
            pixel_values: Vec::<f32>::try_from(&patches)?,
            grid_thw: [gt, gh, gw],
            // verl hands the processor no frame rate: Qwen2.5-VL's counts two frames a second.
            seconds_per_grid: Some(t as f64 / SAMPLE_FPS),
            timestamps: timestamps(&fetched.seconds, cfg.merge_size, gt as usize),
        },
        source: fetched.source,
    })
}

/// The sizes of a fetched stack of `frames` frames of `height × width` (fetched with
/// `fetch_patch`-pixel patches): resized within the video's bounds (each frame within 128 to
/// 768 merged patches, all frames within the whole-video budget, a fractional bound past
/// about 300 frames, unless the cell says), then by the processor `video` to its own.
fn stack_sizes(
    frames: usize,
    (height, width): (usize, usize),
    fetch_patch: usize,
    opts: &VideoOptions,
    cfg: &ImageProcessorConfig,
    video: VideoProcessor,
) -> Result<[Size; 2], ImageError> {
    let bad = |why: String| ImageError::Video(why);
    let (p, m, t) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    if t == 0 || !frames.is_multiple_of(t) {
        return Err(bad(format!("{frames} frames for temporal patches of {t}")));
    }
    let factor = fetch_patch * 2;
    let f2 = (factor * factor) as f64;
    let min = opts.min_pixels.unwrap_or(VIDEO_MIN_TOKENS as f64 * f2);
    let total = opts.total_pixels.unwrap_or(MODEL_SEQ_LEN * f2 * 0.9);
    let max = (VIDEO_MAX_TOKENS as f64 * f2)
        .min(total / frames as f64 * FRAME_FACTOR as f64)
        .max((min * 1.05).floor());
    let max = opts.max_pixels.map_or(max, |m| m.min(max));
    if max < min {
        return Err(bad(format!(
            "the frames' max_pixels ({max}) is below their min_pixels ({min})"
        )));
    }
    let stacked = smart_resize(height, width, factor, (min, max), ResizeRule::QwenVlUtils)?;
    let processed = video.size(frames, stacked, p * m, t)?;
    Ok([stacked, processed])
}

/// A height and a width in pixels.
type Size = (usize, usize);
