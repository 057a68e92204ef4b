//! The `data.*` settings the trainer's datasets and sampler read.

use serde::{Deserialize, Serialize};

/// What happens to a prompt longer than `max_prompt_length` (verl's `data.truncation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Truncation {
    /// Fail, naming the row.
    #[default]
    Error,
    /// Keep the last tokens.
    Left,
    /// Keep the first tokens.
    Right,
    /// Keep the first `max/2` and the last `max - max/2` tokens.
    Middle,
}

/// Training and validation data (`data.*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataSpec {
    pub train_files: Vec<String>,
    pub val_files: Vec<String>,
    pub prompt_key: String,
    pub reward_fn_key: String,
    pub max_prompt_length: usize,
    pub truncation: Truncation,
    pub filter_overlong_prompts: bool,
    /// `train_max_samples` (`None`: verl's -1, all rows).
    pub train_max_samples: Option<usize>,
    pub val_max_samples: Option<usize>,
    /// Shuffle the training prompts each epoch (and pick a `max_samples` subset at random).
    pub shuffle: bool,
    /// `validation_shuffle`: pick the validation subset at random.
    pub validation_shuffle: bool,
    /// `data.seed` (verl's default 1).
    pub seed: u64,
    /// Prompts a step generates first: verl's legacy trainer's dataloader batch
    /// (`gen_batch_size`, else `train_batch_size`); `train_batch_size` under verl 0.9's v1
    /// trainer, whose `gen_batch_size` is only how many prompts its dataloader fetches at a time.
    pub batch_size: usize,
    /// `train_batch_size`: the prompt groups a step trains on (DAPO's dynamic sampling generates
    /// until it has this many that vary).
    pub train_batch_size: usize,
    /// Prompts per validation batch (`None`: the whole set at once).
    pub val_batch_size: Option<usize>,
    /// `apply_chat_template_kwargs`.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// `image_key`: the column of a row's images, read when the model has a vision tower.
    #[serde(default = "default_image_key")]
    pub image_key: String,
    /// `image_patch_size`: the patch size verl's dataset fetches images with when it measures
    /// prompts for `filter_overlong_prompts` (`None`: the image processor's).
    #[serde(default)]
    pub image_patch_size: Option<usize>,
    /// `data.custom_cls`: the user's dataset class, built in a Python helper.
    #[serde(default)]
    pub custom_dataset: Option<PyClass>,
    /// `data.sampler.{class_path, class_name}`: the user's sampler class.
    #[serde(default)]
    pub sampler: Option<PyClass>,
    /// The composed `data` section, the `config` those classes are built with (`Null` when
    /// neither is set).
    #[serde(default)]
    pub config: serde_json::Value,
}

/// A Python class verl loads by file (or `pkg://module`) and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PyClass {
    pub path: String,
    pub name: String,
}

fn default_image_key() -> String {
    "images".to_owned()
}
