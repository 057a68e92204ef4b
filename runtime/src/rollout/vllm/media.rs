//! Prompts with images and videos on the vLLM server, as verl hands them to vLLM
//! (`multi_modal_data`).
//!
//! vLLM's multimodal processor expands each item's placeholder itself, from the item: a prompt
//! goes with one `<|image_pad|>` per image and one `<|video_pad|>` per video (verl's raw prompt
//! ids hold an image's so; a Qwen3-VL video's timestamps and vision spans are cut too, since
//! vLLM writes them again), and its items through vLLM's token-in/token-out endpoint
//! (`/inference/v1/generate`, served with `--enable-scale-out`), the one that takes token ids
//! and media together. The items are those verlc's processor prepared, recovered exactly from
//! their pixel values at the processed size: the server's processor, given the same settings
//! (`preprocessor_config.json` and `video_preprocessor_config.json` beside the weights),
//! resizes nothing and computes the same patches. Images go as PNG data URLs; a video as its
//! frames (PNG, or float32 where the processor's resize left them between 8-bit levels) with
//! the frame times verl's processor was given, under a media type of verlc's own that the
//! server's launcher reads ([`super::server::WATCHDOG`]): vLLM's own frame-list type carries
//! no per-video times. The server answers with the prompt as it
//! expanded it, which must equal verlc's ids token for token ([`check_expanded`]).

use base64::Engine as _;
use serde_json::{Value, json};

use crate::data::image::{ImageProcessorConfig, patch_order};
use crate::data::vision_prompt::VISION_END;
use crate::model::vision::{MropeTokens, ProcessedImage};
use crate::tokenizer::Tokenizer;

/// vLLM's endpoint that takes token ids with images and videos.
pub const GENERATE_PATH: &str = "/inference/v1/generate";

/// The data-URL media type of a video's frames with their times, as the launcher reads it:
/// the base64 of a JSON object of vLLM's video metadata and the frames' `encoding`, then,
/// comma-separated, each frame's PNG in base64 (`png`) or one base64 block of all frames'
/// float32 levels (`f32`, its `shape` in the object). The launcher's code names the same
/// string.
pub const VIDEO_FRAMES_TYPE: &str = "video/x-verlc-frames";

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The frames of `item` (an image, or a video, prepared by `cfg`) as RGB levels (0 to 255) at
/// their processed size: `(height, width, frames)`, each value recovered from its normalised
/// one. An image gives one frame (its temporal patch repeats it); a video each frame of each
/// temporal patch, the processor's padding frame included (it repeats the last, so the
/// server's processor pads to the same).
fn frame_levels(
    item: &ProcessedImage,
    cfg: &ImageProcessorConfig,
) -> Result<(usize, usize, Vec<Vec<f32>>), String> {
    let [t, gh, gw] = item.grid_thw;
    let video = item.seconds_per_grid.is_some();
    if !video && t != 1 {
        return Err(format!("an image of {t} temporal patches"));
    }
    let m = cfg.merge_size;
    let (t, gh, gw) = (t.max(0) as usize, gh.max(0) as usize, gw.max(0) as usize);
    if m == 0 || gh % m != 0 || gw % m != 0 {
        return Err(format!("a grid of {gh}x{gw} patches does not merge by {m}"));
    }
    let block = gh * gw * cfg.patch_width();
    if item.pixel_values.len() != t * block {
        return Err(format!(
            "{} pixel values for a {t}x{gh}x{gw} grid of {}-value patches",
            item.pixel_values.len(),
            cfg.patch_width()
        ));
    }
    let (h, w) = (gh * cfg.patch_size, gw * cfg.patch_size);
    let per_block = if video { cfg.temporal_patch_size } else { 1 };
    let mut frames = vec![vec![0f32; h * w * 3]; t * per_block];
    for (k, values) in item.pixel_values.chunks(block.max(1)).enumerate() {
        for ((y, x, c, frame), v) in patch_order(cfg, gh, gw).zip(values) {
            if frame < per_block {
                frames[k * per_block + frame][(y * w + x) * 3 + c] =
                    (v * cfg.image_std[c] + cfg.image_mean[c]) * 255.0;
            }
        }
    }
    Ok((h, w, frames))
}

/// `levels` as 8-bit values when each lies within rounding of one (an image, or a video frame
/// the processor did not resize); `None` when the processor's resize left values between
/// levels or beyond them (bicubic overshoot), which 8 bits cannot carry.
fn eight_bit(levels: &[f32]) -> Option<Vec<u8>> {
    levels
        .iter()
        .map(|&l| {
            let r = l.round();
            ((l - r).abs() < 1e-2 && (0.0..=255.0).contains(&r)).then_some(r as u8)
        })
        .collect()
}

/// `levels` rounded into 8 bits, clamped (an image's are 8-bit values up to rounding).
fn rounded(levels: &[f32]) -> Vec<u8> {
    levels
        .iter()
        .map(|l| l.round().clamp(0.0, 255.0) as u8)
        .collect()
}

/// An 8-bit RGB picture as a PNG.
fn png(height: usize, width: usize, rgb: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width as u32, height as u32);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(rgb).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

/// The video metadata vLLM's processor takes for a video of `frames` frames (with
/// `do_sample_frames` off: the frames are already sampled), chosen so that what it derives
/// equals what verlc's processor wrote: Qwen3-VL's timestamps (`timestamped`) are the mean
/// time of each temporal patch's first and last frame, index over `fps`, so each frame is
/// given its patch's timestamp as its index at 1 frame a second; Qwen2.5-VL's seconds per
/// temporal patch are `temporal_patch_size` over the sampled rate, which is `fps` when every
/// frame is sampled.
fn video_metadata(
    item: &ProcessedImage,
    frames: usize,
    temporal_patch: usize,
    timestamped: bool,
) -> Value {
    if timestamped {
        let indices: Vec<f64> = item
            .timestamps
            .iter()
            .flat_map(|&t| std::iter::repeat_n(t, temporal_patch))
            .collect();
        json!({"fps": 1.0, "frames_indices": indices, "total_num_frames": frames})
    } else {
        let per_grid = item.seconds_per_grid.unwrap_or(1.0);
        json!({
            "fps": temporal_patch as f64 / per_grid,
            "frames_indices": (0..frames).collect::<Vec<_>>(),
            "total_num_frames": frames,
        })
    }
}

/// The endpoint's `content_parts` of a prompt's images and videos, in order (`timestamped`:
/// the model's processor writes Qwen3-VL's timestamps). A video's frames go as PNGs when they
/// are 8-bit values, else as little-endian float32 levels (`encoding: "f32"`, one block of
/// `shape` frames × height × width × 3): verl hands vLLM the frames qwen_vl_utils fetched, in
/// floating point, and the processor's resize of those (when the fetch's size is not the
/// processor's) lies between levels.
pub fn content_parts(
    items: &[ProcessedImage],
    cfg: &ImageProcessorConfig,
    timestamped: bool,
) -> Result<Vec<Value>, String> {
    items
        .iter()
        .map(|item| {
            let (h, w, frames) = frame_levels(item, cfg)?;
            if item.seconds_per_grid.is_none() {
                let png = png(h, w, &rounded(&frames[0]))?;
                let url = format!("data:image/png;base64,{}", base64(&png));
                return Ok(json!({"type": "image_url", "url": url}));
            }
            let mut meta = video_metadata(item, frames.len(), cfg.temporal_patch_size, timestamped);
            let pngs: Option<Vec<Vec<u8>>> = frames.iter().map(|f| eight_bit(f)).collect();
            let body = match pngs {
                Some(pngs) => {
                    meta["encoding"] = json!("png");
                    pngs.iter()
                        .map(|rgb| png(h, w, rgb).map(|p| base64(&p)))
                        .collect::<Result<Vec<_>, _>>()?
                        .join(",")
                }
                None => {
                    meta["encoding"] = json!("f32");
                    meta["shape"] = json!([frames.len(), h, w, 3]);
                    let bytes: Vec<u8> = frames
                        .iter()
                        .flatten()
                        .flat_map(|l| l.to_le_bytes())
                        .collect();
                    base64(&bytes)
                }
            };
            let url = format!(
                "data:{VIDEO_FRAMES_TYPE};base64,{},{body}",
                base64(meta.to_string().as_bytes())
            );
            Ok(json!({"type": "video_url", "url": url}))
        })
        .collect()
}

/// The tokens a Qwen3-VL video stands for in a prompt, as vLLM's processor writes them: for
/// each temporal patch its timestamp (`<1.5 seconds>`, tokenized alone), a vision span and
/// the patch's video pads (the span's end is the tokenizer's `<|vision_end|>`, as in verlc's
/// prompt).
fn timestamped_span(
    item: &ProcessedImage,
    tokens: &MropeTokens,
    tok: &Tokenizer,
) -> Result<Vec<i64>, String> {
    let per_patch =
        item.tokens(tokens.spatial_merge_size.max(1) as usize) / item.grid_thw[0].max(1) as usize;
    let vision_end = tok
        .token_to_id(VISION_END)
        .ok_or_else(|| format!("the tokenizer has no `{VISION_END}` token"))?;
    let mut span = Vec::new();
    for second in &item.timestamps {
        span.extend(
            tok.encode(&format!("<{second:.1} seconds>"), false)
                .map_err(|e| e.to_string())?,
        );
        span.push(tokens.vision_start_token_id);
        span.extend(std::iter::repeat_n(tokens.video_token_id, per_patch));
        span.push(vision_end);
    }
    Ok(span)
}

/// The prompt vLLM is sent for `ids` (verlc's, placeholders expanded) with `items` (its images
/// and videos in order): each image's run of pads cut to one, as verl's
/// `qwen2_5_vl_dedup_image_tokens`; each video's to one video pad (a Qwen2.5-VL video's run;
/// a Qwen3-VL video's whole timestamped span, `tok` spelling its timestamps). vLLM's
/// processor (transformers 5's layout: it expands the bare pad) writes them back.
pub fn collapsed_prompt(
    ids: &[i64],
    items: &[ProcessedImage],
    tokens: &MropeTokens,
    tok: &Tokenizer,
) -> Result<Vec<i64>, String> {
    let mut spans = Vec::new();
    if tokens.timestamped_videos {
        for (k, item) in items
            .iter()
            .filter(|i| i.seconds_per_grid.is_some())
            .enumerate()
        {
            spans.push((k, timestamped_span(item, tokens, tok)?));
        }
    }
    let mut spans = spans.into_iter().peekable();
    let runs = |t: i64| {
        t == tokens.image_token_id || (t == tokens.video_token_id && !tokens.timestamped_videos)
    };
    let mut out: Vec<i64> = Vec::with_capacity(ids.len());
    let mut i = 0;
    while i < ids.len() {
        if let Some((_, span)) = spans.peek()
            && ids[i..].starts_with(span)
        {
            out.push(tokens.video_token_id);
            i += span.len();
            spans.next();
            continue;
        }
        if !(runs(ids[i]) && i > 0 && ids[i - 1] == ids[i]) {
            out.push(ids[i]);
        }
        i += 1;
    }
    if let Some((k, _)) = spans.next() {
        return Err(format!(
            "video {k}'s tokens (each temporal patch's timestamp, vision span and pads) are not \
             in the prompt as vLLM's processor writes them: the text before the video may have \
             merged with its first timestamp in tokenization"
        ));
    }
    Ok(out)
}

/// The endpoint's body from a `/v1/completions` body (`completion`: its sampling fields go
/// under `sampling_params`), with the prompt's ids `collapsed` and its media `parts`; the
/// server answers with the prompt as it expanded it.
pub fn generate_body(completion: &Value, collapsed: Vec<i64>, parts: Vec<Value>) -> Value {
    let mut params = completion.clone();
    if let Some(obj) = params.as_object_mut() {
        for key in ["model", "prompt", "return_tokens_as_token_ids"] {
            obj.remove(key);
        }
        obj.insert("detokenize".into(), json!(false));
    }
    json!({
        "model": completion["model"],
        "token_ids": collapsed,
        "content_parts": parts,
        "sampling_params": params,
        "return_token_ids": true,
    })
}

/// The server's answer expanded the prompt as verlc did: `answer.prompt_token_ids` equals
/// `expected` (verlc's ids and any tokens a resumed sample carries).
pub fn check_expanded(answer: &Value, expected: &[i64]) -> Result<(), String> {
    let got: Vec<i64> = answer
        .get("prompt_token_ids")
        .and_then(Value::as_array)
        .ok_or("no `prompt_token_ids` in the answer")?
        .iter()
        .map(|t| {
            t.as_i64()
                .ok_or_else(|| format!("prompt token {t} is not an id"))
        })
        .collect::<Result<_, _>>()?;
    if got == expected {
        return Ok(());
    }
    let at = got
        .iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(expected.len()));
    let window = |ids: &[i64]| ids[at.saturating_sub(3)..(at + 4).min(ids.len())].to_vec();
    Err(format!(
        "vLLM's processor expanded the prompt's images and videos to {} tokens where verlc's \
         has {}; they part at token {at} (vLLM {:?}, verlc {:?})",
        got.len(),
        expected.len(),
        window(&got),
        window(expected)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny Qwen3-VL's tokenizer and its vision tokens: `(image, video, start, end)` pads
    /// and span ids.
    fn vision_tokenizer(timestamped_videos: bool) -> (Tokenizer, MropeTokens, [i64; 4]) {
        let tok = Tokenizer::from_pretrained("builtin://tiny?arch=qwen3_vl").unwrap();
        let id = |s: &str| tok.token_to_id(s).unwrap();
        let ids = [
            id("<|image_pad|>"),
            id("<|video_pad|>"),
            id("<|vision_start|>"),
            id(VISION_END),
        ];
        let tokens = MropeTokens {
            image_token_id: ids[0],
            video_token_id: ids[1],
            vision_start_token_id: ids[2],
            spatial_merge_size: 2,
            tokens_per_second: 2.0,
            timestamped_videos,
        };
        (tok, tokens, ids)
    }

    #[test]
    fn placeholder_runs_collapse_to_one_token_each() {
        let (tok, tokens, [image, video, start, end]) = vision_tokenizer(false);
        assert_eq!(
            collapsed_prompt(
                &[1, 9, image, image, image, 8, 9, image, image, 8, image],
                &[],
                &tokens,
                &tok
            )
            .unwrap(),
            vec![1, 9, image, 8, 9, image, 8, image]
        );
        // Qwen2.5-VL's videos: a run of video pads, like an image's.
        assert_eq!(
            collapsed_prompt(
                &[start, video, video, video, end, start, image, image, end],
                &[],
                &tokens,
                &tok
            )
            .unwrap(),
            vec![start, video, end, start, image, end]
        );
    }

    /// A Qwen3-VL video's timestamps, vision spans and pads become one video pad, beside an
    /// image's run and a second video right after the first; a prompt whose spans are not
    /// spelled as vLLM spells them is refused.
    #[test]
    fn a_timestamped_video_collapses_to_one_pad() {
        let (tok, t, [image, video_pad, start, end]) = vision_tokenizer(true);
        let video = |seconds: &[f64]| ProcessedImage {
            pixel_values: Vec::new(),
            grid_thw: [seconds.len() as i64, 2, 4],
            seconds_per_grid: Some(1.0),
            timestamps: seconds.to_vec(),
        };
        let picture = ProcessedImage {
            pixel_values: Vec::new(),
            grid_thw: [1, 2, 2],
            seconds_per_grid: None,
            timestamps: Vec::new(),
        };
        let (a, b) = (video(&[0.5, 1.5]), video(&[0.25]));
        let span_a = timestamped_span(&a, &t, &tok).unwrap();
        let span_b = timestamped_span(&b, &t, &tok).unwrap();
        // Two pads per patch (2x4 patches merged by 2x2), each patch behind its time, in a
        // vision span of its own.
        assert_eq!(span_a.iter().filter(|&&x| x == video_pad).count(), 4);
        assert_eq!(span_b.iter().filter(|&&x| x == start).count(), 1);
        assert_eq!(span_b.last(), Some(&end));
        let ids = [vec![1, start, image, end], span_a.clone(), span_b, vec![9]].concat();
        let items = [picture, a.clone(), b];
        assert_eq!(
            collapsed_prompt(&ids, &items, &t, &tok).unwrap(),
            vec![1, start, image, end, video_pad, video_pad, 9]
        );
        let mut merged = ids.clone();
        merged[4] += 1000;
        let err = collapsed_prompt(&merged, &items, &t, &tok).unwrap_err();
        assert!(err.contains("video 0"), "{err}");
    }

    #[test]
    fn a_processed_image_comes_back_as_its_pixels() {
        let cfg = ImageProcessorConfig {
            patch_size: 2,
            min_pixels: 16,
            max_pixels: 1024,
            ..ImageProcessorConfig::default()
        };
        // A 4x4 image of distinct levels, processed as the data pipeline does.
        let data: Vec<u8> = (0..48).map(|i| (i * 5 + 3) as u8).collect();
        let img = crate::data::image::RgbImage {
            width: 4,
            height: 4,
            data: data.clone(),
        };
        let processed = crate::data::image::process_image(&img, (Some(16), None), &cfg).unwrap();
        assert_eq!(processed.grid_thw, [1, 2, 2]);
        let (h, w, frames) = frame_levels(&processed, &cfg).unwrap();
        assert_eq!(frames.len(), 1);
        let rgb = eight_bit(&frames[0]).expect("an image's levels are 8-bit values");
        let back = crate::data::image::decode_png(&png(h, w, &rgb).unwrap()).unwrap();
        assert_eq!((back.width, back.height), (4, 4));
        assert_eq!(back.data, data);
    }

    /// A video's frames come back as the processor prepared them (the padding frame
    /// included): as 8-bit values where the processor kept the fetched size (processed
    /// again, they give the same patches), as levels between 8-bit values where it resized
    /// (a fetch held below the processor's bounds); and its metadata gives vLLM's processor
    /// verlc's times.
    #[test]
    fn a_processed_video_comes_back_as_its_frames() {
        use crate::data::video::{VideoOptions, VideoProcessor, VideoSource, process_video};
        let cfg = ImageProcessorConfig::default();
        let frame = |seed: usize| crate::data::image::RgbImage {
            width: 40,
            height: 30,
            data: (0..40 * 30 * 3)
                .map(|i| ((i * 7 + seed * 50) % 256) as u8)
                .collect(),
        };
        let frames: Vec<_> = (0..3).map(frame).collect();
        let small = VideoOptions {
            min_pixels: Some(3136.0),
            max_pixels: Some(3136.0),
            ..VideoOptions::default()
        };
        for processor in [VideoProcessor::Qwen2Vl, VideoProcessor::QWEN3_VL_DEFAULT] {
            let process = |frames: Vec<crate::data::image::RgbImage>, opts: &VideoOptions| {
                process_video(
                    &VideoSource::Frames(frames),
                    opts,
                    cfg.patch_size,
                    &cfg,
                    processor,
                )
                .unwrap()
                .video
            };
            let video = process(frames.clone(), &VideoOptions::default());
            let (h, w, back) = frame_levels(&video, &cfg).unwrap();
            assert_eq!(back.len(), 4, "{processor:?}: 3 frames padded to 2 patches");
            let again = process(
                back.iter()
                    .map(|levels| crate::data::image::RgbImage {
                        width: w,
                        height: h,
                        data: eight_bit(levels).expect("8-bit frames"),
                    })
                    .collect(),
                &VideoOptions::default(),
            );
            assert_eq!(again.grid_thw, video.grid_thw);
            let gap = again
                .pixel_values
                .iter()
                .zip(&video.pixel_values)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(gap < 1e-5, "{processor:?}: {gap}");
            // Fetched at 56 x 56, then resized by the processor to its bounds.
            let resized = process(frames.clone(), &small);
            let (_, _, levels) = frame_levels(&resized, &cfg).unwrap();
            assert!(
                levels.iter().any(|f| eight_bit(f).is_none()),
                "{processor:?}"
            );
            let part = &content_parts(std::slice::from_ref(&resized), &cfg, false).unwrap()[0];
            let url = part["url"].as_str().unwrap();
            let head = url.split([',']).nth(1).unwrap();
            let meta: Value = serde_json::from_slice(
                &base64::engine::general_purpose::STANDARD
                    .decode(head)
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(meta["encoding"], "f32", "{processor:?}");

            let meta = video_metadata(&video, 4, cfg.temporal_patch_size, processor.timestamped());
            if processor.timestamped() {
                let indices: Vec<f64> =
                    serde_json::from_value(meta["frames_indices"].clone()).unwrap();
                let means: Vec<f64> = indices.chunks(2).map(|p| (p[0] + p[1]) / 2.0).collect();
                assert_eq!(means, video.timestamps);
            } else {
                let fps = meta["fps"].as_f64().unwrap();
                assert_eq!(
                    Some(cfg.temporal_patch_size as f64 / fps),
                    video.seconds_per_grid
                );
            }
        }
    }
}
