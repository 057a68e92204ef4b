//! The prompt dataset, `data` (group `data/legacy_data.yaml`): files, columns, lengths,
//! batch size, shuffling, and multimodal and chat-template options.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{OneOrMany, OpenDict};

/// What happens to a prompt longer than `max_prompt_length`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Truncation {
    /// Fail with an error.
    #[serde(rename = "error")]
    Error,
    /// Drop tokens from the start.
    #[serde(rename = "left")]
    Left,
    /// Drop tokens from the end.
    #[serde(rename = "right")]
    Right,
    /// Drop tokens from the middle, keeping both ends.
    #[serde(rename = "middle")]
    Middle,
}

/// A user class given as a Python file and a class name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClassRef {
    /// Python file that defines the class; null uses verl's built-in one.
    pub path: Option<String>,
    /// Name of the class in that file.
    pub name: Option<String>,
}

/// A custom (e.g. curriculum) sampler for the training dataloader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SamplerConfig {
    /// Python file that defines the sampler; null uses random or sequential sampling.
    pub class_path: Option<String>,
    /// Name of the sampler class in that file.
    pub class_name: Option<String>,
}

/// The prompt dataset and its dataloader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Tokenizer name or path; null uses the policy model's tokenizer.
    pub tokenizer: Option<String>,
    /// Stage dataset files in shared memory.
    pub use_shm: bool,
    /// Training parquet (or JSON) file(s).
    pub train_files: OneOrMany<String>,
    /// Validation parquet (or JSON) file(s).
    pub val_files: OneOrMany<String>,
    /// Use at most this many training samples; -1 uses all.
    #[schemars(range(min = -1))]
    pub train_max_samples: i64,
    /// Use at most this many validation samples; -1 uses all.
    #[schemars(range(min = -1))]
    pub val_max_samples: i64,
    /// Column holding the chat-formatted prompt.
    pub prompt_key: String,
    /// Column that selects the reward function of a sample.
    pub reward_fn_key: String,
    /// Longest prompt in tokens (after the chat template).
    #[schemars(range(min = 1))]
    pub max_prompt_length: i64,
    /// Longest generated response in tokens.
    #[schemars(range(min = 1))]
    pub max_response_length: i64,
    /// Prompts per training step.
    #[schemars(range(min = 1))]
    pub train_batch_size: i64,
    /// Deprecated: ignored; the whole validation set is generated as one batch.
    #[schemars(range(min = 1), extend("deprecated" = true))]
    pub val_batch_size: Option<i64>,
    /// Tool definitions for multi-turn prompts; mirrors
    /// `actor_rollout_ref.rollout.multi_turn.tool_config_path`.
    pub tool_config_path: Option<String>,
    /// Also return prompt token ids without the chat template (for a reward model with a
    /// different template).
    pub return_raw_input_ids: bool,
    /// Also return the raw chat messages (needed by agent loops and some reward models).
    pub return_raw_chat: bool,
    /// Also return the templated prompt text.
    pub return_full_prompt: bool,
    /// Shuffle the training data each epoch.
    pub shuffle: bool,
    /// Seed of the training shuffle; null uses a fixed default.
    pub seed: Option<i64>,
    /// Dataloader worker processes.
    #[schemars(range(min = 0))]
    pub dataloader_num_workers: i64,
    /// Vision patch size used when counting image tokens.
    #[schemars(range(min = 1))]
    pub image_patch_size: i64,
    /// Shuffle the validation data.
    pub validation_shuffle: bool,
    /// Drop prompts longer than `max_prompt_length` when loading.
    pub filter_overlong_prompts: bool,
    /// Processes used to filter over-long prompts.
    #[schemars(range(min = 1))]
    pub filter_overlong_prompts_workers: i64,
    /// Handling of prompts longer than `max_prompt_length`.
    pub truncation: Truncation,
    /// Column holding the images of multimodal samples.
    pub image_key: String,
    /// Column holding the videos of multimodal samples.
    pub video_key: String,
    /// Allow running Python code shipped with the tokenizer or processor.
    pub trust_remote_code: bool,
    /// Custom dataset class.
    pub custom_cls: ClassRef,
    /// Return processed multimodal inputs with each sample.
    pub return_multi_modal_inputs: bool,
    /// Custom sampler.
    pub sampler: SamplerConfig,
    /// Dynamic data generator that augments the dataset during training.
    pub datagen: ClassRef,
    /// Extra keyword arguments for the tokenizer's chat template.
    pub apply_chat_template_kwargs: OpenDict,

    /// Prompts per generation batch; absent uses `train_batch_size` (larger values feed
    /// group filtering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub gen_batch_size: Option<i64>,
    /// Local cache folder for remote dataset files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<String>,
    /// Name of a function that formats prompts instead of the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_func: Option<String>,
    /// Require per-sample tool arguments in `extra_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub need_tools_kwargs: Option<bool>,
    /// Filter prompts when loading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_prompts: Option<bool>,
}
