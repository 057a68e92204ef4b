//! Decoder-only transformers of the Llama / Qwen2 / Qwen3 family on tch, with Hugging Face
//! checkpoint I/O.
//!
//! - [`config`]: `config.json` ([`ModelConfig`]), with HF key names.
//! - [`decoder`]: the Llama / Qwen2 / Qwen3 decoder, the one every engine and the rollout
//!   run (whole, or one tensor-parallel rank's shards of a pipeline stage's layers).
//! - [`layers`]: what architectures share: the (column- or row-split, LoRA-wrapped) linear,
//!   RMSNorm, and the [`layers::Regions`] a layer crosses at tensor-parallel boundaries.
//! - [`rope`], [`cache`]: rotary embeddings (default, linear, dynamic, llama3, yarn) and the
//!   preallocated KV cache.
//! - [`heads`]: [`CausalLm`] (actor / reference / rollout) and [`ValueModel`] (critic).
//! - [`load`] / [`save`]: safetensors, single file or sharded with an index; VarStore names
//!   equal the checkpoint names, so no renaming table exists (Qwen3-Next's fused DeltaNet
//!   projections are split on load and fused on save: [`qwen3_next`]).
//! - [`init`]: transformers-style random initialisation from a seed; [`builtin`]: the
//!   `builtin://tiny` model that needs no files.
//! - [`pretrained`]: `from_pretrained`-style entry points used by the trainer.

pub mod builtin;
pub mod cache;
pub mod config;
pub mod decoder;
pub mod eager_attention;
pub mod fused_experts;
pub mod gated_deltanet;
pub mod heads;
pub mod init;
pub mod layers;
pub mod load;
pub mod lora;
pub mod moe;
pub mod packed;
pub mod pretrained;
pub mod qwen3_next;
pub mod rank_group;
pub mod rope;
pub mod save;
pub mod stored;
pub mod tensor_parallel;
pub mod vision;

use std::path::{Path, PathBuf};

pub use cache::{KvCache, causal_padding_mask, position_ids_from_mask};
pub use config::{Arch, LinearAttentionConfig, ModelConfig, MoeConfig};
pub use heads::{CausalLm, ValueModel};
pub use load::{Checkpoint, LoadOptions, LoadReport, Shard};
pub use pretrained::{
    Dtype, LoadedModel, ModelKind, ModelSource, TorchKind, from_pretrained, reward_from_pretrained,
    value_from_pretrained,
};
pub use save::{SaveOptions, save_pretrained};

/// Errors of model construction and checkpoint I/O. File errors name the file, and tensor
/// errors name the tensor.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: invalid model config: {msg}", file.display())]
    Config { file: PathBuf, msg: String },
    #[error("{}: no `model.safetensors` or `model.safetensors.index.json` found", dir.display())]
    NoWeights { dir: PathBuf },
    #[error("{}: invalid safetensors index: {msg}", file.display())]
    Index { file: PathBuf, msg: String },
    #[error("{}: corrupt or truncated safetensors file{}: {msg}", file.display(), tensor_suffix(tensor))]
    Corrupt {
        file: PathBuf,
        tensor: Option<String>,
        msg: String,
    },
    #[error("{}: tensor `{tensor}` has shape {found:?}, the model expects {expected:?}", file.display())]
    ShapeMismatch {
        file: PathBuf,
        tensor: String,
        expected: Vec<i64>,
        found: Vec<i64>,
    },
    #[error("{}: tensor `{tensor}` has unsupported dtype {dtype}", file.display())]
    Dtype {
        file: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("{}: tensor `{tensor}` is listed in the index but missing from {}", index.display(), file.display())]
    MissingFromShard {
        index: PathBuf,
        file: PathBuf,
        tensor: String,
    },
    #[error("{}: checkpoint has no tensor `{tensor}` (and {more} more missing)", dir.display())]
    Missing {
        dir: PathBuf,
        tensor: String,
        more: usize,
    },
    #[error("{}: unexpected tensor `{tensor}` (not a parameter of this model)", file.display())]
    Unexpected { file: PathBuf, tensor: String },
    #[error("{}: cannot shard tensor `{tensor}`: {msg}", file.display())]
    Shard {
        file: PathBuf,
        tensor: String,
        msg: String,
    },
    #[error("model `{path}`: {msg}")]
    Source { path: String, msg: String },
    #[error("{0}")]
    Torch(#[from] tch::TchError),
}

fn tensor_suffix(t: &Option<String>) -> String {
    t.as_ref()
        .map(|t| format!(" (tensor `{t}`)"))
        .unwrap_or_default()
}

impl ModelError {
    pub(crate) fn io(file: &Path, source: std::io::Error) -> Self {
        ModelError::Io {
            file: file.to_owned(),
            source,
        }
    }
}
