//! Images of vision-language rows as verl prepares them for Qwen-VL models: `process_image`
//! (qwen_vl_utils' `fetch_image`: to RGB, an RGBA image over white; resized by `smart_resize`
//! with Pillow's bicubic filter), then the model's image processor (transformers'
//! `Qwen2VLImageProcessor`: `smart_resize` again, rescale to [0, 1], normalise by the CLIP mean
//! and std, cut into `temporal_patch_size × patch_size²` patches in merge-block order, one
//! frame repeated to fill a temporal patch).
//!
//! The resize is Pillow's (`Image.resize` with `BICUBIC`, 8 bits a channel): a separable filter
//! whose support widens with the scale when shrinking, coefficients in 22-bit fixed point, each
//! pass rounded to 8 bits, in Pillow's order. So the pixels equal verl's bit for bit.
//! PNG files only for now (JPEG decoders differ in their last bit).

use serde::Deserialize;

/// An 8-bit RGB image, rows top to bottom, pixels `r, g, b`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// Why an image cannot be prepared.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("not a PNG image verlc can read: {0}")]
    Decode(String),
    #[error("absolute aspect ratio must be smaller than 200, got {0}")]
    AspectRatio(f64),
    #[error("an image of {width} x {height} pixels is empty")]
    Empty { width: usize, height: usize },
    #[error("the image's max_pixels ({max}) is below its min_pixels ({min})")]
    Bounds { min: usize, max: usize },
    #[error("a video: {0}")]
    Video(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// The image of a cell of verl's multimodal datasets: `{"bytes": ..., "path": ...}` (the
/// Hugging Face datasets layout of geo3k and the other preprocessed sets; the bytes in base64,
/// as verlc's parquet reader gives binary columns), else a path (`file://` allowed), read as
/// a PNG file.
pub fn image_from_cell(cell: &serde_json::Value) -> Result<RgbImage, ImageError> {
    use base64::Engine as _;
    use serde_json::Value;
    let read = |path: &str| {
        let path = path.strip_prefix("file://").unwrap_or(path);
        std::fs::read(path).map_err(|e| ImageError::Decode(format!("{path}: {e}")))
    };
    let bytes = match cell {
        Value::Object(m) => match (m.get("bytes"), m.get("path").or_else(|| m.get("image"))) {
            (Some(Value::String(b)), _) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| ImageError::Decode(format!("the image bytes are not base64: {e}")))?,
            (_, Some(Value::String(p))) => read(p)?,
            _ => {
                return Err(ImageError::Decode(
                    "an image cell holds neither `bytes` nor a `path`".into(),
                ));
            }
        },
        Value::String(p) => read(p)?,
        other => {
            return Err(ImageError::Decode(format!(
                "an image cell must be {{bytes, path}} or a path, got {other}"
            )));
        }
    };
    decode_png(&bytes)
}

/// Decodes a PNG file's bytes to RGB as qwen_vl_utils' `to_rgb` does: RGBA over a white
/// background (Pillow's paste with the alpha as mask), other modes converted (their alpha, if
/// any, dropped).
pub fn decode_png(bytes: &[u8]) -> Result<RgbImage, ImageError> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder
        .read_info()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    let source = reader.info().color_type;
    let mut buf = vec![0; reader.output_buffer_size().unwrap_or(0)];
    let frame = reader
        .next_frame(&mut buf)
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    let (width, height) = (frame.width as usize, frame.height as usize);
    if width == 0 || height == 0 {
        return Err(ImageError::Empty { width, height });
    }
    let pixels = &buf[..frame.buffer_size()];
    let mut data = Vec::with_capacity(width * height * 3);
    // Pillow's MULDIV255: (a * b + 128) rounded by 255.
    let muldiv = |a: u32, b: u32| {
        let t = a * b + 128;
        ((t >> 8) + t) >> 8
    };
    match frame.color_type {
        png::ColorType::Rgb => data.extend_from_slice(pixels),
        png::ColorType::Rgba if source == png::ColorType::Rgba => {
            for p in pixels.chunks_exact(4) {
                let a = u32::from(p[3]);
                for &c in &p[..3] {
                    data.push((muldiv(u32::from(c), a) + muldiv(255, 255 - a)) as u8);
                }
            }
        }
        png::ColorType::Rgba => {
            for p in pixels.chunks_exact(4) {
                data.extend_from_slice(&p[..3]);
            }
        }
        png::ColorType::Grayscale => {
            for &g in pixels {
                data.extend_from_slice(&[g, g, g]);
            }
        }
        png::ColorType::GrayscaleAlpha => {
            for p in pixels.chunks_exact(2) {
                data.extend_from_slice(&[p[0], p[0], p[0]]);
            }
        }
        png::ColorType::Indexed => {
            return Err(ImageError::Decode("an unexpanded palette".into()));
        }
    }
    Ok(RgbImage {
        width,
        height,
        data,
    })
}

/// Whose `smart_resize` (they differ in one clamp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeRule {
    /// qwen_vl_utils' (`fetch_image`): shrinking may go below one factor.
    QwenVlUtils,
    /// transformers' (`Qwen2VLImageProcessor`): at least one factor each way when shrinking.
    Transformers,
}

/// `(height, width)` of a `height × width` image resized to multiples of `factor` within
/// `[min_pixels, max_pixels]`, its aspect ratio kept as closely as possible (the bounds in
/// float: qwen_vl_utils' video bound can be fractional).
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    (min_pixels, max_pixels): (f64, f64),
    rule: ResizeRule,
) -> Result<(usize, usize), ImageError> {
    if height == 0 || width == 0 {
        return Err(ImageError::Empty { width, height });
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        return Err(ImageError::AspectRatio(ratio));
    }
    // Python's round (half to even) of the quotient.
    let round = |x: f64| ((x / f).round_ties_even() * f) as usize;
    let (mut hb, mut wb) = match rule {
        ResizeRule::QwenVlUtils => (round(h).max(factor), round(w).max(factor)),
        ResizeRule::Transformers => (round(h), round(w)),
    };
    if (hb * wb) as f64 > max_pixels {
        let beta = (h * w / max_pixels).sqrt();
        let floor = |x: f64| ((x / f).floor() * f) as usize;
        (hb, wb) = (floor(h / beta), floor(w / beta));
        if rule == ResizeRule::Transformers {
            (hb, wb) = (hb.max(factor), wb.max(factor));
        }
    } else if ((hb * wb) as f64) < min_pixels {
        let beta = (min_pixels / (h * w)).sqrt();
        let ceil = |x: f64| ((x / f).ceil() * f) as usize;
        (hb, wb) = (ceil(h * beta), ceil(w * beta));
    }
    Ok((hb, wb))
}

/// Pillow's bicubic kernel (a = -0.5).
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

const PRECISION_BITS: u32 = 32 - 8 - 2;

/// For each output position: the first input position, and the fixed-point weights of the
/// inputs from there (Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc`).
fn coefficients(in_size: usize, out_size: usize) -> Vec<(usize, Vec<i32>)> {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    (0..out_size)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let weights: Vec<f64> = (xmin..xmax)
                .map(|x| bicubic((x as f64 - center + 0.5) * ss))
                .collect();
            let total: f64 = weights.iter().sum();
            let fixed = weights
                .iter()
                .map(|w| {
                    let w = if total != 0.0 { w / total } else { *w };
                    let v = w * f64::from(1u32 << PRECISION_BITS);
                    (if v < 0.0 { v - 0.5 } else { v + 0.5 }) as i32
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

/// Pillow's `clip8`: a fixed-point sum back to a byte.
fn clip8(v: i64) -> u8 {
    let v = v >> PRECISION_BITS;
    v.clamp(0, 255) as u8
}

/// Pillow's `Image.resize(size, BICUBIC)` of an 8-bit RGB image (the same size is a copy).
/// Each pass rounds to bytes, so their order matters: Pillow 13 resizes vertically first when
/// the height loses more than twice the rows the width loses columns (a width that grows
/// loses a negative number), horizontally first otherwise (measured against Pillow 13.0 on
/// 400 random size pairs; Pillow 12 and earlier always went horizontally first).
pub fn resize_bicubic(img: &RgbImage, width: usize, height: usize) -> RgbImage {
    let rows_lost = img.height as i64 - height as i64;
    let columns_lost = img.width as i64 - width as i64;
    if rows_lost > 0 && rows_lost > 2 * columns_lost {
        resize_columns(&resize_rows(img, height), width)
    } else {
        resize_rows(&resize_columns(img, width), height)
    }
}

/// The horizontal pass: each row resampled to `width` pixels.
fn resize_columns(img: &RgbImage, width: usize) -> RgbImage {
    if width == img.width {
        return img.clone();
    }
    let coeffs = coefficients(img.width, width);
    let mut data = vec![0u8; width * img.height * 3];
    for y in 0..img.height {
        let row = &img.data[y * img.width * 3..(y + 1) * img.width * 3];
        for (x, (start, k)) in coeffs.iter().enumerate() {
            for c in 0..3 {
                let mut ss: i64 = 1 << (PRECISION_BITS - 1);
                for (i, w) in k.iter().enumerate() {
                    ss += i64::from(row[(start + i) * 3 + c]) * i64::from(*w);
                }
                data[(y * width + x) * 3 + c] = clip8(ss);
            }
        }
    }
    RgbImage {
        width,
        height: img.height,
        data,
    }
}

/// The vertical pass: each column resampled to `height` pixels.
fn resize_rows(img: &RgbImage, height: usize) -> RgbImage {
    if height == img.height {
        return img.clone();
    }
    let coeffs = coefficients(img.height, height);
    let stride = img.width * 3;
    let mut data = vec![0u8; stride * height];
    for (y, (start, k)) in coeffs.iter().enumerate() {
        for xc in 0..stride {
            let mut ss: i64 = 1 << (PRECISION_BITS - 1);
            for (i, w) in k.iter().enumerate() {
                ss += i64::from(img.data[(start + i) * stride + xc]) * i64::from(*w);
            }
            data[y * stride + xc] = clip8(ss);
        }
    }
    RgbImage {
        width: img.width,
        height,
        data,
    }
}

/// A Qwen-VL model's `preprocessor_config.json` (transformers' defaults where absent).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ImageProcessorConfig {
    #[serde(default = "defaults::patch_size")]
    pub patch_size: usize,
    #[serde(default = "defaults::temporal_patch_size")]
    pub temporal_patch_size: usize,
    #[serde(default = "defaults::merge_size")]
    pub merge_size: usize,
    #[serde(default = "defaults::min_pixels")]
    pub min_pixels: usize,
    #[serde(default = "defaults::max_pixels")]
    pub max_pixels: usize,
    #[serde(default = "defaults::image_mean")]
    pub image_mean: [f32; 3],
    #[serde(default = "defaults::image_std")]
    pub image_std: [f32; 3],
}

mod defaults {
    pub fn patch_size() -> usize {
        14
    }
    pub fn temporal_patch_size() -> usize {
        2
    }
    pub fn merge_size() -> usize {
        2
    }
    pub fn min_pixels() -> usize {
        56 * 56
    }
    pub fn max_pixels() -> usize {
        28 * 28 * 1280
    }
    pub fn image_mean() -> [f32; 3] {
        [0.481_454_66, 0.457_827_5, 0.408_210_73]
    }
    pub fn image_std() -> [f32; 3] {
        [0.268_629_54, 0.261_302_6, 0.275_777_1]
    }
}

impl Default for ImageProcessorConfig {
    fn default() -> Self {
        ImageProcessorConfig {
            patch_size: defaults::patch_size(),
            temporal_patch_size: defaults::temporal_patch_size(),
            merge_size: defaults::merge_size(),
            min_pixels: defaults::min_pixels(),
            max_pixels: defaults::max_pixels(),
            image_mean: defaults::image_mean(),
            image_std: defaults::image_std(),
        }
    }
}

impl ImageProcessorConfig {
    /// The image processor of the model in `dir`: its `preprocessor_config.json`, else
    /// transformers' defaults for Qwen2-VL processors.
    pub fn from_model_dir(dir: &std::path::Path) -> Result<Self, String> {
        let file = dir.join("preprocessor_config.json");
        if !file.is_file() {
            return Ok(Self::default());
        }
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        Self::from_json(&text).map_err(|e| format!("{}: {e}", file.display()))
    }

    /// A `preprocessor_config.json`'s text. Newer processors (Qwen3-VL's) give the pixel
    /// bounds as `size: {shortest_edge, longest_edge}` instead of `min_pixels`/`max_pixels`,
    /// which transformers reads the same way.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let mut v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if let Some(obj) = v.as_object_mut() {
            let size = obj.get("size").cloned();
            for (key, edge) in [
                ("min_pixels", "shortest_edge"),
                ("max_pixels", "longest_edge"),
            ] {
                let bound = size.as_ref().and_then(|s| s.get(edge)).cloned();
                if let (false, Some(b)) = (obj.get(key).is_some_and(|x| !x.is_null()), bound) {
                    obj.insert(key.into(), b);
                }
            }
        }
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    /// Writes `preprocessor_config.json` into a saved model directory `dir`: the source
    /// model's own file when it has one (`source_dir`), else these settings as transformers'
    /// Qwen2-VL image processor reads them. The source's `video_preprocessor_config.json` (a
    /// Qwen3-VL video processor's `size`) goes with it.
    pub fn save(
        &self,
        dir: &std::path::Path,
        source_dir: Option<&std::path::Path>,
    ) -> Result<(), String> {
        const VIDEO: &str = "video_preprocessor_config.json";
        if let Some(src) = source_dir.map(|d| d.join(VIDEO)).filter(|f| f.is_file()) {
            let out = dir.join(VIDEO);
            std::fs::copy(&src, &out).map_err(|e| format!("{}: {e}", out.display()))?;
        }
        let out = dir.join("preprocessor_config.json");
        if let Some(src) = source_dir
            .map(|d| d.join("preprocessor_config.json"))
            .filter(|f| f.is_file())
        {
            return std::fs::copy(&src, &out)
                .map(|_| ())
                .map_err(|e| format!("{}: {e}", out.display()));
        }
        let mut doc = self.processor_fields();
        doc.extend([
            (
                "image_processor_type".into(),
                serde_json::json!("Qwen2VLImageProcessor"),
            ),
            (
                "processor_class".into(),
                serde_json::json!("Qwen2_5_VLProcessor"),
            ),
            ("min_pixels".into(), serde_json::json!(self.min_pixels)),
            ("max_pixels".into(), serde_json::json!(self.max_pixels)),
        ]);
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(&out, text).map_err(|e| format!("{}: {e}", out.display()))
    }

    /// What transformers' Qwen-VL image and video processors read alike: the resize,
    /// rescale and normalisation settings and the patch sizes.
    pub(crate) fn processor_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let serde_json::Value::Object(fields) = serde_json::json!({
            "do_resize": true,
            "do_rescale": true,
            "rescale_factor": 1.0 / 255.0,
            "do_normalize": true,
            "do_convert_rgb": true,
            "resample": 3,
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "merge_size": self.merge_size,
            "image_mean": self.image_mean,
            "image_std": self.image_std,
        }) else {
            return serde_json::Map::new();
        };
        fields
    }

    /// Values per patch (`3 × temporal_patch_size × patch_size²`).
    pub fn patch_width(&self) -> usize {
        3 * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

pub use crate::model::vision::ProcessedImage;

/// An image cell's own `min_pixels` and `max_pixels` (qwen_vl_utils reads them from the
/// cell; either may be absent).
pub type FetchPixels = (Option<usize>, Option<usize>);

/// The size `fetch_image` resizes a `height × width` image to with `patch`-pixel patches: to
/// multiples of two patches (its own merge size, not the processor's) within the cell's
/// `pixels` bounds, else its defaults of 4 and 16384 merged patches.
pub(crate) fn fetched_size(
    (height, width): (usize, usize),
    patch: usize,
    (min, max): FetchPixels,
) -> Result<(usize, usize), ImageError> {
    let factor = patch * 2;
    let (min, max) = (
        min.unwrap_or(4 * factor * factor),
        max.unwrap_or(16384 * factor * factor),
    );
    // qwen_vl_utils asserts this of the bounds it resizes within.
    if max < min {
        return Err(ImageError::Bounds { min, max });
    }
    smart_resize(
        height,
        width,
        factor,
        (min as f64, max as f64),
        ResizeRule::QwenVlUtils,
    )
}

/// The size the processor `cfg` resizes a `height × width` image to.
fn processed_size(
    (height, width): (usize, usize),
    cfg: &ImageProcessorConfig,
) -> Result<(usize, usize), ImageError> {
    let factor = cfg.patch_size * cfg.merge_size;
    smart_resize(
        height,
        width,
        factor,
        (cfg.min_pixels as f64, cfg.max_pixels as f64),
        ResizeRule::Transformers,
    )
}

/// The placeholder tokens an image of `height × width` pixels takes when qwen_vl_utils fetches
/// it with `fetch_patch`-pixel patches (within `fetch_pixels`) before the processor `cfg`:
/// verl's measure of a prompt for `filter_overlong_prompts` (its dataset fetches with
/// `data.image_patch_size`, its rollout with the processor's own patch size).
pub fn tokens_fetched_with(
    (height, width): (usize, usize),
    fetch_patch: usize,
    fetch_pixels: FetchPixels,
    cfg: &ImageProcessorConfig,
) -> Result<usize, ImageError> {
    let fetched = fetched_size((height, width), fetch_patch, fetch_pixels)?;
    let (h, w) = processed_size(fetched, cfg)?;
    let (p, m) = (cfg.patch_size, cfg.merge_size);
    Ok((h / p) * (w / p) / (m * m))
}

/// The pixel each value of an image's `pixel_values` holds, in the processor `cfg`'s order for a
/// `gh × gw` patch grid: `(row, column, channel, frame)`. Patches in merge-block order; within a
/// patch channel, frame, row, column (an image's one frame repeated over the temporal patch).
pub fn patch_order(
    cfg: &ImageProcessorConfig,
    gh: usize,
    gw: usize,
) -> impl Iterator<Item = (usize, usize, usize, usize)> + use<> {
    let (p, m, frames) = (
        cfg.patch_size,
        cfg.merge_size.max(1),
        cfg.temporal_patch_size,
    );
    let pairs = |a: usize, b: usize| (0..a).flat_map(move |i| (0..b).map(move |j| (i, j)));
    pairs(gh / m, gw / m)
        .flat_map(move |(bh, bw)| {
            pairs(m, m).map(move |(ih, iw)| ((bh * m + ih) * p, (bw * m + iw) * p))
        })
        .flat_map(move |(py, px)| {
            pairs(3, frames).flat_map(move |(c, frame)| {
                pairs(p, p).map(move |(y, x)| (py + y, px + x, c, frame))
            })
        })
}

/// verl's preparation of one image (module docs): `fetch_image`'s resize within
/// `fetch_pixels` with the processor's patch size, as verl's rollout fetches, then the
/// processor's.
pub fn process_image(
    img: &RgbImage,
    fetch_pixels: FetchPixels,
    cfg: &ImageProcessorConfig,
) -> Result<ProcessedImage, ImageError> {
    let (h, w) = fetched_size((img.height, img.width), cfg.patch_size, fetch_pixels)?;
    let fetched = resize_bicubic(img, w, h);
    let (h, w) = processed_size((fetched.height, fetched.width), cfg)?;
    let img = resize_bicubic(&fetched, w, h);
    // transformers' rescale (in float64, stored as float32), then normalize in float32.
    let scale = 1.0f64 / 255.0;
    let normalised = |y: usize, x: usize, c: usize| -> f32 {
        let v = (f64::from(img.data[(y * w + x) * 3 + c]) * scale) as f32;
        (v - cfg.image_mean[c]) / cfg.image_std[c]
    };
    let (gh, gw) = (h / cfg.patch_size, w / cfg.patch_size);
    let pixel_values: Vec<f32> = patch_order(cfg, gh, gw)
        .map(|(y, x, c, _)| normalised(y, x, c))
        .collect();
    Ok(ProcessedImage {
        pixel_values,
        grid_thw: [1, gh as i64, gw as i64],
        seconds_per_grid: None,
        timestamps: Vec::new(),
    })
}
