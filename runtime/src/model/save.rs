//! Saving in Hugging Face layout: `config.json` plus `model.safetensors`, or numbered shards
//! with `model.safetensors.index.json` when the weights exceed the shard size, so
//! `AutoModel*.from_pretrained(dir)` loads the result.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::{Dtype, View};
use serde_json::{Value, json};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::load::{INDEX_FILE, SINGLE_FILE};
use super::{ModelConfig, ModelError};

/// Options of [`save_pretrained`].
#[derive(Debug, Clone)]
pub struct SaveOptions {
    /// Largest shard in bytes (transformers' default is 5 GB).
    pub max_shard_bytes: u64,
    /// Dtype of the saved tensors; `None` keeps each variable's.
    pub dtype: Option<Kind>,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            max_shard_bytes: 5_000_000_000,
            dtype: None,
        }
    }
}

struct Bytes {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Bytes {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn dtype_of(kind: Kind) -> Option<(Dtype, &'static str)> {
    Some(match kind {
        Kind::Float => (Dtype::F32, "float32"),
        Kind::Half => (Dtype::F16, "float16"),
        Kind::BFloat16 => (Dtype::BF16, "bfloat16"),
        Kind::Double => (Dtype::F64, "float64"),
        Kind::Int64 => (Dtype::I64, "int64"),
        Kind::Int => (Dtype::I32, "int32"),
        _ => return None,
    })
}

fn to_bytes(name: &str, t: &Tensor, kind: Option<Kind>, dir: &Path) -> Result<Bytes, ModelError> {
    let t = t.to_device(Device::Cpu);
    let t = kind
        .map_or(t.shallow_clone(), |k| t.to_kind(k))
        .contiguous();
    let (dtype, _) = dtype_of(t.kind()).ok_or_else(|| ModelError::Dtype {
        file: dir.to_owned(),
        tensor: name.to_owned(),
        dtype: format!("{:?}", t.kind()),
    })?;
    let numel = t.numel();
    let mut data = vec![0u8; numel * t.kind().elt_size_in_bytes()];
    t.f_copy_data_u8(&mut data, numel)?;
    Ok(Bytes {
        dtype,
        shape: t.size().iter().map(|&d| d as usize).collect(),
        data,
    })
}

/// Saves a VarStore whose names are checkpoint names, with `config.json` declaring
/// `architecture` (e.g. [`super::Arch::causal_lm_class`]).
pub fn save_pretrained(
    vs: &VarStore,
    config: &ModelConfig,
    architecture: &str,
    dir: &Path,
    opts: &SaveOptions,
) -> Result<(), ModelError> {
    let named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    save_named(&named, config, architecture, dir, opts)
}

/// The text model of an image-text model built on a text family's layers (a Qwen3.5
/// checkpoint, [`ModelConfig::text_model`]) and its parameters among `named` (all but the
/// tower's): what a consumer of text prompts only loads as the text family's causal LM.
/// `None` for other families.
pub fn text_model_of(
    config: &ModelConfig,
    named: &[(String, Tensor)],
) -> Option<(ModelConfig, Vec<(String, Tensor)>)> {
    let text = config.text_model()?;
    let params = named
        .iter()
        .filter(|(n, _)| !n.starts_with("visual."))
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    Some((text, params))
}

/// Saves `(name, tensor)` pairs (e.g. gathered full parameters) in Hugging Face layout.
pub fn save_named(
    named: &[(String, Tensor)],
    config: &ModelConfig,
    architecture: &str,
    dir: &Path,
    opts: &SaveOptions,
) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    remove_old_weights(dir)?;
    // Qwen3-Next's DeltaNet projections and Qwen3-VL-MoE's experts are stored fused (see
    // `model::stored`).
    let fused;
    let named = match super::stored::StoredLayout::of(config) {
        Some(f) => {
            fused = f.fuse(named).map_err(|msg| ModelError::Config {
                file: dir.join("config.json"),
                msg,
            })?;
            fused.as_slice()
        }
        None => named,
    };
    // Qwen3-VL's checkpoints carry transformers' module-tree names (see `load::text_model_name`
    // for the way back).
    let renamed: Vec<(String, Tensor)>;
    let named = if config
        .arch()
        .ok()
        .and_then(|a| a.tower())
        .is_some_and(|t| t.module_tree_names())
    {
        renamed = named
            .iter()
            .map(|(n, t)| (super::load::module_tree_name(n), t.shallow_clone()))
            .collect();
        renamed.as_slice()
    } else {
        named
    };
    let mut sorted: Vec<&(String, Tensor)> = named.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let saved_kind = opts.dtype.unwrap_or_else(|| {
        let embed = named
            .iter()
            .find(|(n, _)| n.ends_with("embed_tokens.weight"));
        embed
            .or(named.first())
            .map_or(Kind::Float, |(_, t)| t.kind())
    });
    let mut shards: Vec<Vec<(String, Bytes)>> = vec![Vec::new()];
    let (mut shard_bytes, mut total) = (0u64, 0u64);
    for (name, t) in sorted {
        let b = to_bytes(name, t, opts.dtype, dir)?;
        let len = b.data.len() as u64;
        if shard_bytes > 0 && shard_bytes + len > opts.max_shard_bytes {
            shards.push(Vec::new());
            shard_bytes = 0;
        }
        shard_bytes += len;
        total += len;
        if let Some(last) = shards.last_mut() {
            last.push((name.clone(), b));
        }
    }
    let meta = Some(HashMap::from([("format".to_owned(), "pt".to_owned())]));
    let write = |file: &Path, tensors: &[(String, Bytes)]| {
        let items = tensors.iter().map(|(n, b)| (n.as_str(), b));
        safetensors::serialize_to_file(items, &meta, file).map_err(|e| ModelError::Corrupt {
            file: file.to_owned(),
            tensor: None,
            msg: e.to_string(),
        })
    };
    if shards.len() == 1 {
        write(&dir.join(SINGLE_FILE), &shards[0])?;
    } else {
        let mut weight_map = serde_json::Map::new();
        let n = shards.len();
        for (i, shard) in shards.iter().enumerate() {
            let fname = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
            write(&dir.join(&fname), shard)?;
            for (name, _) in shard {
                weight_map.insert(name.clone(), Value::String(fname.clone()));
            }
        }
        let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        write_json(&dir.join(INDEX_FILE), &index)?;
    }
    let mut cfg = serde_json::to_value(config).map_err(|e| ModelError::Config {
        file: dir.join("config.json"),
        msg: e.to_string(),
    })?;
    if let Some(obj) = cfg.as_object_mut() {
        obj.insert("architectures".to_owned(), json!([architecture]));
        // Stated, not left to each config class's default (Qwen3's is 128, not hidden / heads).
        obj.entry("head_dim").or_insert(json!(config.head_dim()));
        if config.expert_style().biased() {
            // That family's config class counts its experts by this key only.
            if let Some(n) = obj.remove("num_experts") {
                obj.insert("num_local_experts".to_owned(), n);
            }
        }
        if architecture.ends_with("ForTokenClassification") {
            // One label: the value head (transformers' default is two).
            obj.insert("id2label".to_owned(), json!({"0": "LABEL_0"}));
            obj.insert("label2id".to_owned(), json!({"LABEL_0": 0}));
        }
        let dtype = dtype_of(saved_kind).map_or("float32", |d| d.1);
        let key = if obj.contains_key("dtype") {
            "dtype"
        } else {
            "torch_dtype"
        };
        obj.insert(key.to_owned(), json!(dtype));
        if config.arch().is_ok_and(|a| a.has_vision()) {
            nest_text_config(obj, &config.model_type);
        }
    }
    write_json(&dir.join("config.json"), &cfg)
}

/// The keys of a vision-language config that are not its text model's.
const MULTIMODAL_KEYS: [&str; 7] = [
    "architectures",
    "model_type",
    "vision_config",
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
];

/// A vision-language config as transformers reads it: Qwen3-VL's config classes take the text
/// model from `text_config` alone (their top-level text keys are ignored), Qwen2.5-VL's from it
/// when present. The text keys stay at the top level too, as Qwen2.5-VL's own files have them
/// (verlc reads either).
fn nest_text_config(obj: &mut serde_json::Map<String, Value>, model_type: &str) {
    let mut text: serde_json::Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| !MULTIMODAL_KEYS.contains(&k.as_str()) && *k != "text_config")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    text.insert("model_type".into(), json!(format!("{model_type}_text")));
    obj.insert("text_config".into(), Value::Object(text));
}

pub(crate) fn write_json(path: &Path, v: &Value) -> Result<(), ModelError> {
    let text = serde_json::to_string_pretty(v).map_err(|e| ModelError::Config {
        file: path.to_owned(),
        msg: e.to_string(),
    })?;
    std::fs::write(path, text + "\n").map_err(|e| ModelError::io(path, e))
}

/// Removes weight files of an earlier save so a stale index cannot shadow the new weights.
fn remove_old_weights(dir: &Path) -> Result<(), ModelError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let shard =
            name.starts_with("model-") && name.ends_with(".safetensors") && name.contains("-of-");
        if name == SINGLE_FILE || name == INDEX_FILE || shard {
            let p = entry.path();
            std::fs::remove_file(&p).map_err(|e| ModelError::io(&p, e))?;
        }
    }
    Ok(())
}
