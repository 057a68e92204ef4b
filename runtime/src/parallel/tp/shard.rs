//! Tensors split over tensor-parallel ranks as the model states each one splits
//! ([`crate::model::tensor_parallel`]): sharded loading from safetensors, and gathering the
//! full tensors back (for export and checkpoints).
//!
//! Like candle's `ShardedSafeTensors` with a `Shard { dim, rank, world_size }` hint: a
//! column-parallel weight is sliced on dim 0 (and its bias), a row-parallel weight on dim 1,
//! the embedding and output layer by vocabulary rows, padded to equal parts
//! ([`super::VocabPartition`]); norms and row-parallel biases are replicated.
use std::collections::HashSet;

use safetensors::SafeTensors;
use tch::Tensor;
use tch::nn::VarStore;

use super::{Result, TpError, VocabPartition};
use crate::model::ModelError;
use crate::model::load::{Checkpoint, LoadReport};
use crate::model::tensor_parallel::ShardSpec;
use crate::parallel::dist::ProcessGroup;
use crate::parallel::mappings::all_gather_dim;

/// This rank's part of a full tensor.
pub fn shard_tensor(
    full: &Tensor,
    spec: ShardSpec,
    rank: i64,
    size: i64,
) -> std::result::Result<Tensor, String> {
    let dims = full.size();
    let part = |dim: i64| -> std::result::Result<(i64, i64), String> {
        let len = *dims
            .get(dim as usize)
            .ok_or_else(|| format!("no dim {dim} in shape {dims:?}"))?;
        Ok((dim, len))
    };
    match spec {
        ShardSpec::Replicated => Ok(full.shallow_clone()),
        ShardSpec::Sections(sizes) => {
            let (_, len) = part(0)?;
            if sizes.iter().sum::<i64>() != len {
                return Err(format!(
                    "sections {sizes:?} do not make dim 0 of size {len}"
                ));
            }
            let mut parts = Vec::with_capacity(3);
            let mut start = 0;
            for n in sizes {
                if n % size != 0 {
                    return Err(format!("a section of {n} cannot be split {size} ways"));
                }
                parts.push(
                    full.f_narrow(0, start + rank * (n / size), n / size)
                        .map_err(|e| e.to_string())?,
                );
                start += n;
            }
            Tensor::f_cat(&parts, 0).map_err(|e| e.to_string())
        }
        ShardSpec::Dim(dim) => {
            let (d, len) = part(dim)?;
            if len % size != 0 {
                return Err(format!("dim {d} of size {len} cannot be split {size} ways"));
            }
            full.f_narrow(d, rank * (len / size), len / size)
                .map_err(|e| e.to_string())
        }
        ShardSpec::Vocab => {
            let (_, len) = part(0)?;
            let p = VocabPartition::new(len, rank, size).map_err(|e| e.to_string())?;
            let torch = |e: tch::TchError| e.to_string();
            let own = full.f_narrow(0, p.start(), p.valid()).map_err(torch)?;
            if p.valid() == p.per_rank {
                return Ok(own);
            }
            let mut shape = dims.clone();
            shape[0] = p.per_rank - p.valid();
            let pad =
                Tensor::f_zeros(shape.as_slice(), (full.kind(), full.device())).map_err(torch)?;
            Tensor::f_cat(&[own, pad], 0).map_err(torch)
        }
    }
}

/// The full tensor from every rank's part (collective over `group`); `full_len` is the real
/// vocabulary size for [`ShardSpec::Vocab`].
pub fn gather_tensor(
    local: &Tensor,
    spec: ShardSpec,
    group: Option<&ProcessGroup>,
    full_len: i64,
) -> Result<Tensor> {
    let Some(g) = group.filter(|g| g.size() > 1) else {
        return Ok(match spec {
            ShardSpec::Vocab => local.f_narrow(0, 0, full_len)?,
            _ => local.shallow_clone(),
        });
    };
    Ok(match spec {
        ShardSpec::Replicated => local.shallow_clone(),
        ShardSpec::Dim(d) => all_gather_dim(local, g, d)?,
        ShardSpec::Vocab => all_gather_dim(local, g, 0)?.f_narrow(0, 0, full_len)?,
        ShardSpec::Sections(sizes) => {
            // Each rank holds its part of every section: gather section by section.
            let w = g.size() as i64;
            let mut full = Vec::with_capacity(3);
            let mut start = 0;
            for n in sizes {
                let mine = local.f_narrow(0, start, n / w)?;
                full.push(all_gather_dim(&mine, g, 0)?);
                start += n / w;
            }
            Tensor::f_cat(&full, 0)?
        }
    })
}

/// Copies this rank's part of every checkpoint tensor that is a variable of `vs` (same name),
/// split by `spec`. Checkpoint tensors that are no variable (other pipeline stages, tied
/// `lm_head.weight`) are reported as unexpected; variables absent from the checkpoint are an
/// error unless their name starts with one of `allow_missing`.
pub fn load_sharded(
    vs: &VarStore,
    ckpt: &Checkpoint,
    spec: &dyn Fn(&str) -> ShardSpec,
    rank: i64,
    size: i64,
    allow_missing: &[String],
) -> Result<LoadReport> {
    let vars = vs.variables();
    let mut report = LoadReport::default();
    let mut seen: HashSet<String> = HashSet::new();
    for file in &ckpt.files {
        let io = |e| ModelError::Io {
            file: file.clone(),
            source: e,
        };
        let handle = std::fs::File::open(file).map_err(io)?;
        // SAFETY: read-only map, dropped at the end of this iteration (see model::load).
        let bytes = unsafe { memmap2::Mmap::map(&handle) }.map_err(io)?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| ModelError::Corrupt {
            file: file.clone(),
            tensor: None,
            msg: e.to_string(),
        })?;
        for (name, view) in st.tensors() {
            let name = crate::model::load::text_model_name(name);
            if !vars.contains_key(&name) && ckpt.stored_whole(&name) {
                // Skipped unread (a multimodal checkpoint's vision tower, say).
                report.unexpected.push(name);
                continue;
            }
            let kind =
                crate::model::load::kind_of(view.dtype()).ok_or_else(|| ModelError::Dtype {
                    file: file.clone(),
                    tensor: name.clone(),
                    dtype: format!("{:?}", view.dtype()),
                })?;
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            let stored = Tensor::f_from_data_size(view.data(), &shape, kind)?;
            for (name, full) in ckpt.held(file, name, stored)? {
                let Some(var) = vars.get(&name) else {
                    report.unexpected.push(name);
                    continue;
                };
                let part = shard_tensor(&full, spec(&name), rank, size).map_err(|msg| {
                    ModelError::Shard {
                        file: file.clone(),
                        tensor: name.clone(),
                        msg,
                    }
                })?;
                if part.size() != var.size() {
                    return Err(ModelError::ShapeMismatch {
                        file: file.clone(),
                        tensor: name,
                        expected: var.size(),
                        found: part.size(),
                    }
                    .into());
                }
                tch::no_grad(|| var.shallow_clone().f_copy_(&part))?;
                seen.insert(name);
                report.loaded += 1;
            }
        }
    }
    let mut missing: Vec<&String> = vars.keys().filter(|n| !seen.contains(*n)).collect();
    missing.sort();
    for name in missing {
        if allow_missing.iter().any(|p| name.starts_with(p.as_str())) {
            report.missing.push(name.clone());
        } else {
            return Err(TpError::Model(ModelError::Missing {
                dir: ckpt.dir.clone(),
                tensor: name.clone(),
                more: 0,
            }));
        }
    }
    Ok(report)
}
