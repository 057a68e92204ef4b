//! Loading Hugging Face safetensors checkpoints into a VarStore whose names are the
//! checkpoint's names: `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`. Files are memory-mapped; tensors are converted to the
//! variable's dtype and device on copy, and may be sliced for tensor parallelism.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use tch::nn::VarStore;
use tch::{Kind, Tensor};

use super::ModelError;
use super::stored::StoredLayout;

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The weight files of a checkpoint directory.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub dir: PathBuf,
    /// The index file, for sharded checkpoints.
    pub index: Option<PathBuf>,
    pub files: Vec<PathBuf>,
    /// Tensor name -> position in `files`, from the index (empty for a single file).
    weight_map: BTreeMap<String, usize>,
    /// Tensors stored fused that the model holds split (Qwen3-Next's DeltaNet projections,
    /// Qwen3-VL-MoE's experts: read from the directory's `config.json`).
    fused: Option<StoredLayout>,
}

impl Checkpoint {
    /// Finds the weights in `dir` (the index wins over a single file when both exist).
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let index = dir.join(INDEX_FILE);
        let mut ckpt = if index.is_file() {
            Self::from_index(dir, index)?
        } else {
            let single = dir.join(SINGLE_FILE);
            if !single.is_file() {
                return Err(ModelError::NoWeights {
                    dir: dir.to_owned(),
                });
            }
            Checkpoint {
                dir: dir.to_owned(),
                index: None,
                files: vec![single],
                weight_map: BTreeMap::new(),
                fused: None,
            }
        };
        // Only a few families store tensors otherwise than the model holds them; their
        // config's sizes place the rows (other configs are not parsed here).
        let config = dir.join("config.json");
        let model_type = std::fs::read_to_string(&config)
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|v| v.get("model_type")?.as_str().map(str::to_owned));
        if model_type.as_deref().is_some_and(StoredLayout::fuses) {
            ckpt.fused = StoredLayout::of(&super::ModelConfig::from_file(&config)?);
        }
        Ok(ckpt)
    }

    /// Every tensor's name and shape, from the files' headers alone (no tensor data is read):
    /// what a run can check before it allocates a model.
    pub fn tensor_shapes(&self) -> Result<Vec<(String, Vec<u64>)>, ModelError> {
        /// Larger headers than safetensors itself accepts are not headers.
        const MAX_HEADER: u64 = 100 << 20;
        let mut out = Vec::new();
        for file in &self.files {
            use std::io::Read as _;
            let corrupt = |msg: String| ModelError::Corrupt {
                file: file.clone(),
                tensor: None,
                msg,
            };
            let mut f = std::fs::File::open(file).map_err(|e| ModelError::io(file, e))?;
            let mut len = [0u8; 8];
            f.read_exact(&mut len)
                .map_err(|e| corrupt(format!("no header length: {e}")))?;
            let len = u64::from_le_bytes(len);
            if len > MAX_HEADER {
                return Err(corrupt(format!("a header of {len} bytes")));
            }
            let mut header = vec![0u8; len as usize];
            f.read_exact(&mut header)
                .map_err(|e| corrupt(format!("header shorter than its length {len}: {e}")))?;
            let json: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
                .map_err(|e| corrupt(format!("header is not a JSON object: {e}")))?;
            for (name, entry) in json {
                if name == "__metadata__" {
                    continue;
                }
                let shape = entry
                    .get("shape")
                    .and_then(serde_json::Value::as_array)
                    .and_then(|dims| dims.iter().map(serde_json::Value::as_u64).collect())
                    .ok_or_else(|| corrupt(format!("`{name}` has no shape")))?;
                out.push((name, shape));
            }
        }
        Ok(out)
    }

    /// Whether checkpoint tensor `name` is held under its own name (else it is read only to
    /// be split into the held ones, [`Checkpoint::held`]).
    pub fn stored_whole(&self, name: &str) -> bool {
        self.fused.is_none_or(|f| !f.is_fused(name))
    }

    /// The tensors the model holds for checkpoint tensor `name` (`t`, read from `file`):
    /// itself, or the parts of a fused one.
    pub fn held(
        &self,
        file: &Path,
        name: String,
        t: Tensor,
    ) -> Result<Vec<(String, Tensor)>, ModelError> {
        match &self.fused {
            None => Ok(vec![(name, t)]),
            Some(f) => f.split(&name, &t).map_err(|msg| ModelError::Shard {
                file: file.to_owned(),
                tensor: name,
                msg,
            }),
        }
    }

    fn from_index(dir: &Path, index: PathBuf) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let bad = |msg: String| ModelError::Index {
            file: index.clone(),
            msg,
        };
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no `weight_map` object".to_owned()))?;
        let mut files: Vec<PathBuf> = Vec::new();
        let mut pos: HashMap<String, usize> = HashMap::new();
        let mut weight_map = BTreeMap::new();
        for (name, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| bad(format!("`{name}` maps to a non-string")))?;
            if file.contains('/') || file.contains("..") {
                return Err(bad(format!(
                    "`{name}` maps to `{file}`, which is not a file name in the directory"
                )));
            }
            let next = files.len();
            let i = *pos.entry(file.to_owned()).or_insert(next);
            if i == next {
                let path = dir.join(file);
                if !path.is_file() {
                    return Err(bad(format!(
                        "shard `{file}` (holding `{name}`) does not exist"
                    )));
                }
                files.push(path);
            }
            weight_map.insert(name.clone(), i);
        }
        Ok(Checkpoint {
            dir: dir.to_owned(),
            index: Some(index),
            files,
            weight_map,
            fused: None,
        })
    }
}

/// Slice of a tensor for one rank: `dim` split into `world_size` equal parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub dim: i64,
    pub rank: i64,
    pub world_size: i64,
}

/// Per-tensor shard hint: the slice of tensor `name` this rank loads, `None` for all of it.
pub type ShardFn<'a> = &'a dyn Fn(&str) -> Option<Shard>;

/// How [`load_weights`] treats sharding, absent and surplus tensors.
#[derive(Default)]
pub struct LoadOptions<'a> {
    /// Per-tensor shard hint (column-parallel: dim 0, row-parallel: dim 1).
    pub shard: Option<ShardFn<'a>>,
    /// Name prefixes that may be absent from the checkpoint; those variables keep their values
    /// (e.g. `score.` for a value head initialised fresh on a causal-LM checkpoint).
    pub allow_missing: Vec<String>,
    /// Fail on checkpoint tensors that are not variables (default: report them).
    pub strict_unexpected: bool,
}

/// What a load did.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    pub loaded: usize,
    /// Variables left as they were (allowed by `allow_missing`).
    pub missing: Vec<String>,
    /// Checkpoint tensors that are no variable (tied `lm_head.weight`, rotary buffers …).
    pub unexpected: Vec<String>,
}

pub(crate) fn kind_of(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F64 => Kind::Double,
        Dtype::I64 => Kind::Int64,
        Dtype::I32 => Kind::Int,
        Dtype::I16 => Kind::Int16,
        Dtype::I8 => Kind::Int8,
        Dtype::U8 => Kind::Uint8,
        Dtype::BOOL => Kind::Bool,
        _ => return None,
    })
}

/// Copies every checkpoint tensor into the variable of the same name.
pub fn load_weights(
    vs: &VarStore,
    ckpt: &Checkpoint,
    opts: &LoadOptions,
) -> Result<LoadReport, ModelError> {
    let vars = vs.variables();
    let mut report = LoadReport::default();
    let mut seen: HashSet<String> = HashSet::new();
    for (fi, file) in ckpt.files.iter().enumerate() {
        let handle = std::fs::File::open(file).map_err(|e| ModelError::io(file, e))?;
        // SAFETY: the map is read-only and lives only during this loop iteration; a file
        // changed concurrently by another process could give wrong values, never UB in Rust
        // code that only reads bytes.
        let bytes = unsafe { memmap2::Mmap::map(&handle) }.map_err(|e| ModelError::io(file, e))?;
        let st =
            SafeTensors::deserialize(&bytes).map_err(|e| diagnose(file, &bytes, &e.to_string()))?;
        if let Some(index) = &ckpt.index {
            let names: HashSet<&String> = st.names().into_iter().collect();
            if let Some((name, _)) = ckpt
                .weight_map
                .iter()
                .find(|(n, i)| **i == fi && !names.contains(n))
            {
                return Err(ModelError::MissingFromShard {
                    index: index.clone(),
                    file: file.clone(),
                    tensor: name.clone(),
                });
            }
        }
        for (name, view) in st.tensors() {
            let name = text_model_name(name);
            if !vars.contains_key(&name) && ckpt.stored_whole(&name) {
                // Skipped unread (a multimodal checkpoint's vision tower, say).
                unexpected(name, file, opts, &mut report)?;
                continue;
            }
            let kind = kind_of(view.dtype()).ok_or_else(|| ModelError::Dtype {
                file: file.clone(),
                tensor: name.clone(),
                dtype: format!("{:?}", view.dtype()),
            })?;
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            let stored = Tensor::f_from_data_size(view.data(), &shape, kind)?;
            for (name, src) in ckpt.held(file, name, stored)? {
                let Some(var) = vars.get(&name) else {
                    unexpected(name, file, opts, &mut report)?;
                    continue;
                };
                let src = match opts.shard.and_then(|f| f(&name)) {
                    Some(s) => shard(&src, s).map_err(|msg| ModelError::Shard {
                        file: file.clone(),
                        tensor: name.clone(),
                        msg,
                    })?,
                    None => src,
                };
                if src.size() != var.size() {
                    return Err(ModelError::ShapeMismatch {
                        file: file.clone(),
                        tensor: name,
                        expected: var.size(),
                        found: src.size(),
                    });
                }
                tch::no_grad(|| var.shallow_clone().f_copy_(&src))?;
                seen.insert(name);
                report.loaded += 1;
            }
        }
    }
    // LoRA adapters are never part of a base checkpoint (they load from their own directory).
    let mut missing: Vec<&String> = vars
        .keys()
        .filter(|n| !seen.contains(*n) && !super::lora::is_adapter(n))
        .collect();
    missing.sort();
    let (allowed, fatal): (Vec<&String>, Vec<&String>) = missing
        .into_iter()
        .partition(|n| opts.allow_missing.iter().any(|p| n.starts_with(p.as_str())));
    if let Some(first) = fatal.first() {
        return Err(ModelError::Missing {
            dir: ckpt.dir.clone(),
            tensor: (*first).clone(),
            more: fatal.len() - 1,
        });
    }
    report.missing = allowed.into_iter().cloned().collect();
    Ok(report)
}

/// A checkpoint tensor the model has no variable for: an error under
/// [`LoadOptions::strict_unexpected`] (unless [`ignorable`]), else listed in the report.
fn unexpected(
    name: String,
    file: &Path,
    opts: &LoadOptions,
    report: &mut LoadReport,
) -> Result<(), ModelError> {
    if opts.strict_unexpected && !ignorable(&name) {
        return Err(ModelError::Unexpected {
            file: file.to_owned(),
            tensor: name,
        });
    }
    report.unexpected.push(name);
    Ok(())
}

/// Tensors a checkpoint may carry that are never parameters: a tied head, rotary tables, and
/// the parts of a Qwen3.5 multimodal checkpoint a text model does not have (the vision tower,
/// multi-token prediction layers).
fn ignorable(name: &str) -> bool {
    name == "lm_head.weight"
        || name.ends_with("rotary_emb.inv_freq")
        || name.starts_with("model.visual.")
        || name.starts_with("visual.")
        || name.starts_with("mtp.")
}

/// A multimodal checkpoint's tensor under the name verlc's models give it: the text model's
/// (`model.language_model.…`, transformers' newer layout of `*ForConditionalGeneration`) as
/// the causal LM's (`model.…`), its vision tower's (`model.visual.…`) as `visual.…` (the
/// layout of Qwen2.5-VL's own files).
pub(crate) fn text_model_name(name: String) -> String {
    if let Some(rest) = name.strip_prefix("model.language_model.") {
        return format!("model.{rest}");
    }
    if let Some(rest) = name.strip_prefix("model.visual.") {
        return format!("visual.{rest}");
    }
    name
}

/// [`text_model_name`] undone: a vision-language model's variable under transformers'
/// module-tree name (`model.layers.0…` as `model.language_model.layers.0…`, `visual.…` as
/// `model.visual.…`; the output layer keeps its name).
pub(crate) fn module_tree_name(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("visual.") {
        return format!("model.visual.{rest}");
    }
    if let Some(rest) = name.strip_prefix("model.") {
        return format!("model.language_model.{rest}");
    }
    name.to_owned()
}

fn shard(t: &Tensor, s: Shard) -> Result<Tensor, String> {
    let size = t.size();
    let len = *size
        .get(s.dim as usize)
        .ok_or_else(|| format!("no dim {} in shape {size:?}", s.dim))?;
    if s.world_size <= 0 || len % s.world_size != 0 || s.rank < 0 || s.rank >= s.world_size {
        return Err(format!(
            "dim {} of size {len} cannot be split {} ways for rank {}",
            s.dim, s.world_size, s.rank
        ));
    }
    let part = len / s.world_size;
    Ok(t.narrow(s.dim, s.rank * part, part))
}

/// Names the tensor at fault in a file that safetensors rejected, by reading its header.
fn diagnose(file: &Path, bytes: &[u8], err: &str) -> ModelError {
    let corrupt = |tensor: Option<String>, msg: String| ModelError::Corrupt {
        file: file.to_owned(),
        tensor,
        msg,
    };
    if bytes.len() < 8 {
        return corrupt(
            None,
            format!(
                "file is {} bytes, shorter than the 8-byte header length",
                bytes.len()
            ),
        );
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&bytes[..8]);
    let n = u64::from_le_bytes(len8) as usize;
    let Some(header) = bytes.get(8..8usize.saturating_add(n)) else {
        return corrupt(
            None,
            format!(
                "header of {n} bytes runs past the end of the file ({} bytes)",
                bytes.len()
            ),
        );
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(header)
    else {
        return corrupt(None, format!("header is not valid JSON ({err})"));
    };
    let body = bytes.len() - 8 - n;
    for (name, info) in json.iter().filter(|(k, _)| *k != "__metadata__") {
        let offsets: Vec<u64> = info
            .get("data_offsets")
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
            .unwrap_or_default();
        let numel: u64 = info
            .get("shape")
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_u64()).product())
            .unwrap_or(0);
        let width = match info.get("dtype").and_then(|v| v.as_str()) {
            Some("F64" | "I64" | "U64") => 8,
            Some("F32" | "I32" | "U32") => 4,
            Some("F16" | "BF16" | "I16" | "U16") => 2,
            _ => 1,
        };
        match offsets.as_slice() {
            [a, b] if *b as usize > body => {
                return corrupt(
                    Some(name.clone()),
                    format!(
                        "data [{a}, {b}) runs past the end of the data section ({body} bytes): file truncated"
                    ),
                );
            }
            [a, b] if b.saturating_sub(*a) != numel * width => {
                return corrupt(
                    Some(name.clone()),
                    format!(
                        "{} bytes of data for {numel} elements",
                        b.saturating_sub(*a)
                    ),
                );
            }
            [_, _] => {}
            _ => return corrupt(Some(name.clone()), "invalid `data_offsets`".to_owned()),
        }
    }
    corrupt(None, err.to_owned())
}
