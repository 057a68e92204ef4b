//! Videos of vision-language rows given as frame lists, as verl prepares them for Qwen-VL
//! models: its `process_video` hands the row's video to qwen_vl_utils' `fetch_video`, which
//! fetches every frame as an image (`fetch_image`: Pillow's bicubic resize, [`super::image`],
//! to multiples of four patches: `fetch_video` passes its factor where `fetch_image` takes a
//! patch size), pads the count to an even number with the last frame, and
//! resizes the stack with torchvision's antialiased bicubic filter within the video's pixel
//! bounds (at least 128 and at most 768 merged patches a frame), back to 8-bit values; then
//! transformers' `Qwen2VLVideoProcessor` resizes to its own bounds (the same ones: a no-op),
//! rescales and normalises in one step (mean and std scaled by 255) and cuts patches of
//! `temporal_patch_size` frames.
//!
//! Qwen3-VL's `Qwen3VLVideoProcessor` bounds the whole video instead (frames × pixels within
//! its `size`, from `video_preprocessor_config.json`), which is not a no-op, and its processor
//! writes each temporal patch into the prompt apart, behind its timestamp ([`timestamps`]).
//!
//! The stack's resize is libtorch's own `_upsample_bicubic2d_aa`, the kernel torchvision
//! calls, so the frames equal verl's bit for bit. Video files (which need a decoder) are not
//! read yet.

use tch::{Device, Kind, Tensor};

use super::image::{
    ImageError, ImageProcessorConfig, ResizeRule, RgbImage, fetched_size, resize_bicubic,
    smart_resize,
};
use crate::model::vision::ProcessedImage;

/// qwen_vl_utils' frame factor: a video's frame count is padded to a multiple of it.
const FRAME_FACTOR: usize = 2;
/// qwen_vl_utils' bounds of a video frame, in merged patches.
const VIDEO_MIN_TOKENS: usize = 128;
const VIDEO_MAX_TOKENS: usize = 768;
/// qwen_vl_utils' whole-video budget: `MODEL_SEQ_LEN` (128000) × factor² × 0.9 pixels.
const MODEL_SEQ_LEN: f64 = 128_000.0;
/// The frame rate a frame list is taken to be sampled at (qwen_vl_utils' `sample_fps`).
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
        match self {
            VideoProcessor::Qwen2Vl => smart_resize(
                height,
                width,
                factor,
                (128 * factor * factor, 768 * factor * factor),
                ResizeRule::Transformers,
            ),
            VideoProcessor::Qwen3Vl {
                min_pixels,
                max_pixels,
            } => video_smart_resize(
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

/// The seconds Qwen3-VL's processor writes before each temporal patch of `video` (a frame
/// list's frames taken at [`SAMPLE_FPS`] from 0, as qwen_vl_utils' metadata says; frames
/// paired by the processor's `merge_size`, the last repeated to fill a pair, each pair at the
/// mean of its first and last frame's time), formatted `<{:.1} seconds>` (Rust's `{:.1}`
/// rounds the exact binary value half to even, as Python's does).
pub fn timestamps(video: &ProcessedImage, merge_size: usize) -> Vec<f64> {
    let m = merge_size.max(1);
    let grid_t = video.grid_thw[0].max(0) as usize;
    let per_patch = video
        .seconds_per_grid
        .map_or(1, |s| (s * SAMPLE_FPS).round().max(1.0) as usize);
    let frames = grid_t * per_patch;
    let mut indices: Vec<usize> = (0..frames).collect();
    while !indices.len().is_multiple_of(m) {
        indices.push(frames.saturating_sub(1));
    }
    let seconds: Vec<f64> = indices.iter().map(|&i| i as f64 / SAMPLE_FPS).collect();
    seconds
        .chunks(m)
        .map(|pair| (pair[0] + pair[pair.len() - 1]) / 2.0)
        .take(grid_t)
        .collect()
}

/// A video as the vision tower takes it, and the seconds one temporal patch spans (what its
/// multimodal positions need).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedVideo {
    pub video: ProcessedImage,
    pub seconds_per_grid: f64,
}

impl ProcessedVideo {
    /// The language model's placeholder tokens for it (one per merged patch).
    pub fn tokens(&self, merge_size: usize) -> usize {
        self.video.tokens(merge_size)
    }
}

/// verl's preparation of a video given as `frames` (module docs): fetched with `fetch_patch`
/// pixel patches (`data.image_patch_size`, or the processor's in the rollout), then the
/// video processor `video` with the patches, normalisation and temporal patch of `cfg`.
pub fn process_video_frames(
    frames: &[RgbImage],
    fetch_patch: usize,
    cfg: &ImageProcessorConfig,
    video: VideoProcessor,
) -> Result<ProcessedVideo, ImageError> {
    let bad = |why: String| ImageError::Video(why);
    let first = frames.first().ok_or_else(|| bad("no frames".into()))?;
    // fetch_video hands `fetch_image` its factor (two patches) where that takes a patch size,
    // so a frame is fetched to multiples of four patches, within four times the bounds.
    let frame_patch = fetch_patch * 2;
    let (h, w) = fetched_size((first.height, first.width), frame_patch, (None, None))?;
    let mut fetched = Vec::with_capacity(frames.len() + 1);
    for (i, f) in frames.iter().enumerate() {
        let size = fetched_size((f.height, f.width), frame_patch, (None, None))?;
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
    let n = fetched.len();
    let (p, m, t) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    if n % t != 0 {
        return Err(bad(format!("{n} frames for temporal patches of {t}")));
    }
    // The stack's size within the video's bounds; the whole-video budget binds only past
    // about 300 frames, where qwen_vl_utils' bound is fractional.
    let factor = fetch_patch * 2;
    let (min, max) = (
        VIDEO_MIN_TOKENS * factor * factor,
        VIDEO_MAX_TOKENS * factor * factor,
    );
    let budget = MODEL_SEQ_LEN * (factor * factor) as f64 * 0.9 / n as f64 * FRAME_FACTOR as f64;
    if budget < max as f64 {
        return Err(bad(format!(
            "{n} frames: past the frame count where qwen_vl_utils' per-frame bound falls below {VIDEO_MAX_TOKENS} merged patches (not implemented)"
        )));
    }
    let (rh, rw) = smart_resize(h, w, factor, (min, max), ResizeRule::QwenVlUtils)?;
    let bytes: Vec<u8> = fetched
        .iter()
        .flat_map(|f| f.data.iter().copied())
        .collect();
    let stack = Tensor::f_from_slice(&bytes)?
        .f_view([n as i64, h as i64, w as i64, 3])?
        .f_permute([0, 3, 1, 2])?
        .f_to_kind(Kind::Float)?;
    // torchvision's resize of an 8-bit stack: in float, clamped, rounded back to 8 bits.
    let stack = stack
        .f_internal_upsample_bicubic2d_aa([rh as i64, rw as i64], false, None, None)?
        .f_clamp(0.0, 255.0)?
        .f_round()?;
    // The processor's resize (in float, not rounded) to its bounds.
    let (ph, pw) = video.size(n, (rh, rw), p * m, t)?;
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
            seconds_per_grid: Some(t as f64 / SAMPLE_FPS),
        },
        seconds_per_grid: t as f64 / SAMPLE_FPS,
    })
}
