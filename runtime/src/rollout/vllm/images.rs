//! Prompts with images on the vLLM server, as verl hands them to vLLM (`multi_modal_data`).
//!
//! vLLM's multimodal processor expands each image's placeholder itself, from the image: a
//! prompt goes with one `<|image_pad|>` per image, as verl's raw prompt ids hold it, and its
//! images as PNG data URLs, through vLLM's token-in/token-out endpoint (`/inference/v1/generate`,
//! served with `--enable-scale-out`), the one that takes token ids and images together. The
//! images are those verlc's processor prepared, recovered exactly from their pixel values at
//! the processed size: the server's processor, given the same settings
//! (`preprocessor_config.json` beside the weights), resizes nothing and computes the same
//! patches, so its placeholders are as many as verlc's.

use base64::Engine as _;
use serde_json::{Value, json};

use crate::data::image::{ImageProcessorConfig, patch_order};
use crate::model::vision::ProcessedImage;

/// vLLM's endpoint that takes token ids with images.
pub const GENERATE_PATH: &str = "/inference/v1/generate";

/// `ids` with each run of `token` (one image's expanded placeholder) cut to one token.
pub fn collapse_placeholders(ids: &[i64], token: i64) -> Vec<i64> {
    let mut out: Vec<i64> = Vec::with_capacity(ids.len());
    for &t in ids {
        if !(t == token && out.last() == Some(&token)) {
            out.push(t);
        }
    }
    out
}

/// The processed image `image` (prepared by `cfg`) as a PNG at its processed size: each
/// pixel's 8-bit value is recovered from its normalised value (the rounding error of the
/// normalisation is far below half a level).
pub fn png(image: &ProcessedImage, cfg: &ImageProcessorConfig) -> Result<Vec<u8>, String> {
    let [t, gh, gw] = image.grid_thw;
    if image.seconds_per_grid.is_some() || t != 1 {
        return Err(
            "videos are not sent to vLLM (its server reads videos from files); they run on the built-in rollout".into(),
        );
    }
    let m = cfg.merge_size;
    let (gh, gw) = (gh as usize, gw as usize);
    if m == 0 || gh % m != 0 || gw % m != 0 {
        return Err(format!(
            "an image grid of {gh}x{gw} patches does not merge by {m}"
        ));
    }
    if image.pixel_values.len() != gh * gw * cfg.patch_width() {
        return Err(format!(
            "{} pixel values for a {gh}x{gw} grid of {}-value patches",
            image.pixel_values.len(),
            cfg.patch_width()
        ));
    }
    let (h, w) = (gh * cfg.patch_size, gw * cfg.patch_size);
    let mut rgb = vec![0u8; h * w * 3];
    // The frames of an image repeat it: the first is read.
    for ((y, x, c, frame), v) in patch_order(cfg, gh, gw).zip(&image.pixel_values) {
        if frame == 0 {
            let level = (v * cfg.image_std[c] + cfg.image_mean[c]) * 255.0;
            rgb[(y * w + x) * 3 + c] = level.round().clamp(0.0, 255.0) as u8;
        }
    }
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w as u32, h as u32);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(&rgb).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

/// The endpoint's `content_parts` of a prompt's images, in order.
pub fn content_parts(
    images: &[ProcessedImage],
    cfg: &ImageProcessorConfig,
) -> Result<Vec<Value>, String> {
    images
        .iter()
        .map(|image| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(png(image, cfg)?);
            Ok(json!({"type": "image_url", "url": format!("data:image/png;base64,{encoded}")}))
        })
        .collect()
}

/// The endpoint's body from a `/v1/completions` body (`completion`: its sampling fields go
/// under `sampling_params`), with the prompt's ids collapsed at `image_token` and its images.
pub fn generate_body(completion: &Value, image_token: i64, parts: Vec<Value>) -> Value {
    let prompt: Vec<i64> = completion["prompt"]
        .as_array()
        .map(|ids| ids.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    let mut params = completion.clone();
    if let Some(obj) = params.as_object_mut() {
        for key in ["model", "prompt", "return_tokens_as_token_ids"] {
            obj.remove(key);
        }
        obj.insert("detokenize".into(), json!(false));
    }
    json!({
        "model": completion["model"],
        "token_ids": collapse_placeholders(&prompt, image_token),
        "content_parts": parts,
        "sampling_params": params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholder_runs_collapse_to_one_token_each() {
        assert_eq!(
            collapse_placeholders(&[1, 9, 7, 7, 7, 8, 9, 7, 7, 8, 7], 7),
            vec![1, 9, 7, 8, 9, 7, 8, 7]
        );
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
        let bytes = png(&processed, &cfg).unwrap();
        let back = crate::data::image::decode_png(&bytes).unwrap();
        assert_eq!((back.width, back.height), (4, 4));
        assert_eq!(back.data, data);
    }
}
