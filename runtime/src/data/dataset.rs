//! [`RlDataset`]: the rows of all files, optionally subsampled, with each prompt rendered
//! through the chat template and tokenized, then filtered (`filter_overlong_prompts`) or
//! truncated (`truncation`) to `max_prompt_length` as verl's `RLHFDataset` does.

use serde_json::{Map, Value};

use crate::tokenizer::Tokenizer;

use super::image::ImageProcessorConfig;
use super::video::VideoProcessor;
use super::vision_prompt::{RowPrompt, VIDEO_KEY, row_prompt};
use super::{DataError, RowProblems, Sample, files};
use crate::engine::batch::RowImages;

pub use verlc_spec::data::Truncation;

/// Cuts `ids` to `max` tokens; `None` means the prompt is too long and `mode` is `Error`.
pub fn truncate(ids: &[i64], max: usize, mode: Truncation) -> Option<Vec<i64>> {
    if ids.len() <= max {
        return Some(ids.to_vec());
    }
    Some(match mode {
        Truncation::Error => return None,
        Truncation::Left => ids[ids.len() - max..].to_vec(),
        Truncation::Right => ids[..max].to_vec(),
        Truncation::Middle => {
            let left = max / 2;
            let right = max - left;
            ids[..left]
                .iter()
                .chain(&ids[ids.len() - right..])
                .copied()
                .collect()
        }
    })
}

/// The `data.*` settings a dataset needs.
#[derive(Debug, Clone)]
pub struct DatasetOptions {
    pub prompt_key: String,
    pub reward_fn_key: String,
    pub max_prompt_length: usize,
    pub truncation: Truncation,
    pub filter_overlong_prompts: bool,
    /// Use at most this many samples; `None` (verl's -1) uses all.
    pub max_samples: Option<usize>,
    /// Pick the `max_samples` subset at random (seeded) instead of the first rows.
    pub shuffle: bool,
    pub seed: u64,
    /// `data.apply_chat_template_kwargs`.
    pub chat_template_kwargs: Map<String, Value>,
    /// A vision-language model's image settings: rows' images are read and prepared, and
    /// their placeholders expanded in the prompt's ids.
    pub vision: Option<VisionData>,
}

/// Where a vision-language model's rows keep their images, and how they are prepared.
#[derive(Debug, Clone)]
pub struct VisionData {
    /// `data.image_key`.
    pub image_key: String,
    /// The model's image processor (`preprocessor_config.json`).
    pub processor: ImageProcessorConfig,
    /// The model's video processor (Qwen3-VL's sizes and lays videos out its own way).
    pub video: VideoProcessor,
    /// `data.image_patch_size`: the patch size verl's dataset fetches images with when it
    /// measures prompts for `filter_overlong_prompts` (the prompts themselves are prepared
    /// with the processor's, as verl's rollout prepares them).
    pub measure_patch_size: usize,
    /// The model's directory (where its `preprocessor_config.json` is); `None` for a
    /// built-in model.
    pub model_dir: Option<std::path::PathBuf>,
    /// Why this run trains on text prompts only (a Qwen3.5 checkpoint beside a critic, as
    /// `verlc build` warned, B022): a row with images is refused.
    pub text_only: Option<String>,
}

impl Default for DatasetOptions {
    fn default() -> Self {
        DatasetOptions {
            prompt_key: "prompt".into(),
            reward_fn_key: "data_source".into(),
            max_prompt_length: 512,
            truncation: Truncation::Error,
            filter_overlong_prompts: false,
            max_samples: None,
            shuffle: true,
            seed: 1,
            chat_template_kwargs: Map::new(),
            vision: None,
        }
    }
}

/// A tokenized prompt with its sample.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptItem {
    pub sample: Sample,
    /// Chat-templated prompt ids (generation prompt added), at most `max_prompt_length`.
    pub input_ids: Vec<i64>,
    /// Where it came from: the file/address and its row number.
    pub source: String,
    pub row: usize,
    /// Its images (a vision-language prompt's, in placeholder order); empty for text.
    pub images: RowImages,
    /// Its place in its dataset's `items` (a batch gathered over ranks finds the images of
    /// its rows by it).
    pub index: usize,
}

/// A vision-language row's prompt ids (placeholders expanded) and prepared images, when the
/// model has a vision tower and the row has images; the image column is taken out of the row
/// (as verl pops it), so rewards never receive the pictures.
fn vision_prompt(
    map: &mut Map<String, Value>,
    tokenizer: &Tokenizer,
    opts: &DatasetOptions,
) -> Result<Option<RowPrompt>, String> {
    let Some(v) = &opts.vision else {
        return Ok(None);
    };
    let videos = holds_any(map, VIDEO_KEY);
    if !holds_any(map, &v.image_key) && !videos {
        map.remove(&v.image_key);
        map.remove(VIDEO_KEY);
        return Ok(None);
    }
    if let Some(why) = &v.text_only {
        return Err(if videos {
            format!("column `{VIDEO_KEY}` holds videos, and {why}")
        } else {
            format!("column `{}` holds images, and {why}", v.image_key)
        });
    }
    let keys = (opts.prompt_key.as_str(), v.image_key.as_str());
    let prompt = row_prompt(
        map,
        keys,
        tokenizer,
        (&v.processor, v.video, v.measure_patch_size),
        &opts.chat_template_kwargs,
    )
    .map_err(|e| format!("column `{}`: {e}", v.image_key))?;
    map.remove(&v.image_key);
    map.remove(VIDEO_KEY);
    Ok(Some(prompt))
}

/// Whether a row's `key` column holds something: not absent, null or an empty list.
fn holds_any(map: &Map<String, Value>, key: &str) -> bool {
    match map.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

/// A prepared prompt dataset.
#[derive(Debug, Clone)]
pub struct RlDataset {
    pub items: Vec<PromptItem>,
    /// Prompts dropped by `filter_overlong_prompts`.
    pub filtered: usize,
}

impl RlDataset {
    /// Reads, concatenates and prepares every file of `files` in order.
    pub fn load(
        files: &[String],
        tokenizer: &Tokenizer,
        opts: &DatasetOptions,
    ) -> Result<Self, DataError> {
        let rows = files::read_sampled(files, opts.max_samples, opts.shuffle, opts.seed)?;
        Self::from_rows(rows, tokenizer, opts)
    }

    /// Prepares `rows` (each named by its file and row) as [`RlDataset::load`] prepares a
    /// file's; `opts.max_samples` is not applied here.
    pub fn from_rows(
        rows: Vec<files::SourcedRow>,
        tokenizer: &Tokenizer,
        opts: &DatasetOptions,
    ) -> Result<Self, DataError> {
        let mut items = Vec::with_capacity(rows.len());
        let mut filtered = 0;
        // Every row is prepared (as a good load does) and every bad one counted, so one run
        // reports all of a file's problems, not the first.
        let mut problems = RowProblems::default();
        for (source, row, mut map) in rows {
            let vision = match vision_prompt(&mut map, tokenizer, opts) {
                Ok(v) => v,
                Err(msg) => {
                    problems.push(DataError::Row {
                        file: source,
                        row,
                        msg,
                    });
                    continue;
                }
            };
            let sample = match Sample::from_row(map, &opts.prompt_key, &opts.reward_fn_key, row) {
                Ok(s) => s,
                Err(msg) => {
                    problems.push(DataError::Row {
                        file: source,
                        row,
                        msg,
                    });
                    continue;
                }
            };
            let (ids, images, measured_len) = match vision {
                Some(v) => (v.ids, v.images, v.measured_len),
                None => {
                    match tokenizer.encode_chat(&sample.prompt, true, &opts.chat_template_kwargs) {
                        Ok(ids) => {
                            let len = ids.len();
                            (ids, Vec::new(), len)
                        }
                        Err(e) => {
                            problems.push(DataError::Tokenize {
                                file: source,
                                row,
                                source: e,
                            });
                            continue;
                        }
                    }
                }
            };
            if opts.filter_overlong_prompts && measured_len > opts.max_prompt_length {
                filtered += 1;
                continue;
            }
            let Some(input_ids) = truncate(&ids, opts.max_prompt_length, opts.truncation) else {
                problems.push(DataError::TooLong {
                    file: source,
                    row,
                    len: ids.len(),
                    max: opts.max_prompt_length,
                });
                continue;
            };
            items.push(PromptItem {
                sample,
                input_ids,
                source,
                row,
                images: images.into(),
                index: items.len(),
            });
        }
        problems.into_result()?;
        if items.is_empty() {
            let why = if filtered > 0 {
                format!(": all {filtered} prompts exceed max_prompt_length")
            } else {
                String::new()
            };
            return Err(DataError::Empty(why));
        }
        Ok(RlDataset { items, filtered })
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The items at `indices` (e.g. one batch of a [`super::BatchSampler`]).
    pub fn batch(&self, indices: &[usize]) -> Vec<&PromptItem> {
        indices.iter().filter_map(|&i| self.items.get(i)).collect()
    }
}
