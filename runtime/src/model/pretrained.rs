//! `from_pretrained`-style entry points: a model path (a Hugging Face checkpoint directory, a
//! Hub id found in the Hub cache, or a `builtin://` model) to a VarStore plus a causal LM or
//! value model, in a dtype on a device.

use std::path::{Path, PathBuf};

use tch::nn::VarStore;
use tch::{Device, Kind};

use verlc_hub::{HubEnv, locate};

use crate::builtin_uri::BuiltinUri;

use super::init::{init_weights, init_weights_where};
use super::load::{Checkpoint, LoadOptions, LoadReport, load_weights};
use super::lora::{init_adapters, load_adapter};
use super::{CausalLm, ModelConfig, ModelError, ValueModel, builtin};

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// A directory with `config.json` and safetensors weights.
    Dir(PathBuf),
    /// A `builtin://` model, randomly initialised.
    Builtin(BuiltinUri),
}

impl ModelSource {
    /// A `builtin://` URI, a directory, or a Hub id looked up in the Hub cache of this
    /// process's environment (`HF_HUB_CACHE`, `HF_HOME`, ...).
    pub fn parse(path: &str) -> Result<Self, ModelError> {
        Self::parse_in(path, &HubEnv::from_env())
    }

    /// [`ModelSource::parse`] with Hub ids looked up in `hub`'s cache.
    pub fn parse_in(path: &str, hub: &HubEnv) -> Result<Self, ModelError> {
        if let Some(uri) = BuiltinUri::parse(path) {
            return Ok(ModelSource::Builtin(uri.map_err(|msg| {
                ModelError::Source {
                    path: path.into(),
                    msg,
                }
            })?));
        }
        match locate(path, None, hub) {
            Ok(loc) => Ok(ModelSource::Dir(
                loc.dir()
                    .map_or_else(|| PathBuf::from(path), Path::to_path_buf),
            )),
            Err(e) => Err(ModelError::Source {
                path: path.into(),
                msg: e.to_string(),
            }),
        }
    }

    /// The model's config.
    pub fn config(&self) -> Result<ModelConfig, ModelError> {
        match self {
            ModelSource::Dir(dir) => ModelConfig::from_file(&dir.join("config.json")),
            ModelSource::Builtin(uri) => builtin::config(uri).map_err(|msg| ModelError::Source {
                path: format!("builtin://{}", uri.name),
                msg,
            }),
        }
    }
}

/// Which head to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    CausalLm,
    Value,
    /// A one-label classifier whose `score.weight` must be in the checkpoint (its bias may
    /// not be: `*ForSequenceClassification` has none, and zero is what the bias starts at).
    Reward,
}

pub use verlc_spec::Dtype;

/// The torch kind of a [`Dtype`] (the one place the runtime maps the two).
pub trait TorchKind {
    fn kind(self) -> Kind;
}

impl TorchKind for Dtype {
    fn kind(self) -> Kind {
        match self {
            Dtype::Fp32 => Kind::Float,
            Dtype::Bf16 => Kind::BFloat16,
            Dtype::Fp16 => Kind::Half,
        }
    }
}

/// A model with its variables.
#[derive(Debug)]
pub struct LoadedModel<M> {
    pub vs: VarStore,
    pub model: M,
    pub config: ModelConfig,
    pub report: LoadReport,
}

fn build<M>(
    path: &str,
    device: Device,
    precision: Dtype,
    seed: u64,
    kind: ModelKind,
    new: impl FnOnce(&ModelConfig, &VarStore) -> Result<M, String>,
) -> Result<LoadedModel<M>, ModelError> {
    let source = ModelSource::parse(path)?;
    let config = source.config()?;
    let mut vs = VarStore::new(device);
    let model = new(&config, &vs).map_err(|msg| ModelError::Source {
        path: path.into(),
        msg,
    })?;
    vs.set_kind(precision.kind());
    let allow_missing = match kind {
        ModelKind::Value => vec!["score.".to_owned()],
        ModelKind::Reward => vec!["score.bias".to_owned()],
        ModelKind::CausalLm => vec![],
    };
    let report = materialize(&vs, &source, &config, seed, allow_missing)?;
    Ok(LoadedModel {
        vs,
        model,
        config,
        report,
    })
}

/// Fills the variables of `vs`, a model built from `source`'s `config`: a `builtin://` model
/// is initialised from `seed`; a checkpoint's tensors are loaded, and the variables under the
/// `fresh` name prefixes it lacks (a new value head) are initialised from `seed`. LoRA adapters
/// (`config.lora`) start as PEFT initialises them, or from their adapter directory.
pub fn materialize(
    vs: &VarStore,
    source: &ModelSource,
    config: &ModelConfig,
    seed: u64,
    fresh: Vec<String>,
) -> Result<LoadReport, ModelError> {
    let report = match source {
        ModelSource::Builtin(_) => {
            init_weights(vs, config, seed)?;
            LoadReport::default()
        }
        ModelSource::Dir(dir) => {
            let ckpt = Checkpoint::open(dir)?;
            let report = load_weights(
                vs,
                &ckpt,
                &LoadOptions {
                    allow_missing: fresh,
                    ..LoadOptions::default()
                },
            )?;
            let missing = report.missing.clone();
            init_weights_where(vs, config, seed, |n| missing.iter().any(|m| m == n))?;
            report
        }
    };
    if let Some(lora) = &config.lora {
        match &lora.adapter_dir {
            Some(dir) => load_adapter(vs, dir)?,
            None => init_adapters(vs, seed)?,
        }
    }
    Ok(report)
}

/// A causal LM from a checkpoint directory or `builtin://tiny` (initialised from `seed`).
pub fn from_pretrained(
    path: &str,
    device: Device,
    precision: Dtype,
    seed: u64,
) -> Result<LoadedModel<CausalLm>, ModelError> {
    build(
        path,
        device,
        precision,
        seed,
        ModelKind::CausalLm,
        |cfg, vs| CausalLm::new(cfg, vs.root()),
    )
}

/// A value model (critic). From a causal-LM checkpoint the `score` head is initialised fresh
/// (as `AutoModelForTokenClassification.from_pretrained` does); `lm_head` is ignored.
pub fn value_from_pretrained(
    path: &str,
    device: Device,
    precision: Dtype,
    seed: u64,
) -> Result<LoadedModel<ValueModel>, ModelError> {
    scalar_head(path, device, precision, seed, ModelKind::Value)
}

/// A reward model: a `*ForSequenceClassification` (or one-label `*ForTokenClassification`)
/// checkpoint, loaded as verl's reward-model worker loads it (as a token classifier with one
/// label, whose bias is zero when the checkpoint has none). A `builtin://` model gets a random
/// head from `seed`.
pub fn reward_from_pretrained(
    path: &str,
    device: Device,
    precision: Dtype,
    seed: u64,
) -> Result<LoadedModel<ValueModel>, ModelError> {
    scalar_head(path, device, precision, seed, ModelKind::Reward)
}

/// A backbone with a one-output `score` head, loaded as `kind` says.
fn scalar_head(
    path: &str,
    device: Device,
    precision: Dtype,
    seed: u64,
    kind: ModelKind,
) -> Result<LoadedModel<ValueModel>, ModelError> {
    build(path, device, precision, seed, kind, |cfg, vs| {
        ValueModel::new(cfg, vs.root())
    })
}

/// True when `path` names a checkpoint directory with weights (for error messages early).
pub fn has_weights(path: &Path) -> bool {
    Checkpoint::open(path).is_ok()
}
