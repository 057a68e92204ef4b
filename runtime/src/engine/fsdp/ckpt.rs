//! Sharded optimizer checkpoints that load at another world size.
//!
//! Each rank writes its optimizer state with [`crate::optim::Optimizer::save`] to
//! `optim_world_size_{W}_rank_{r}.safetensors`. The per-unit tensors (`fsdp.<unit>.main`,
//! `.exp_avg`, `.exp_avg_sq`, `.momentum_buffer`) are this rank's contiguous slice of the
//! unit's padded flat vector, and everything else (steps, groups, fp16 grad scaler,
//! scheduler) is the same on every rank. Loading at world size `W'` concatenates the `W`
//! slices in rank order, drops the old padding, pads for `W'` and keeps this rank's slice, in
//! a file of the same format.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::engine::EngineError;

const PREFIX: &str = "optim_world_size_";

/// The file rank `rank` of a `world`-rank run writes.
pub fn optim_file(dir: &Path, world: usize, rank: usize) -> PathBuf {
    dir.join(format!("{PREFIX}{world}_rank_{rank}.safetensors"))
}

fn ck(path: &Path, msg: impl std::fmt::Display) -> EngineError {
    EngineError::Checkpoint {
        path: path.to_path_buf(),
        msg: msg.to_string(),
    }
}

/// The world size the optimizer state under `dir` was saved with.
pub fn saved_world_size(dir: &Path) -> Result<usize, EngineError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ck(dir, e))?;
    let mut found = None;
    for e in entries {
        let name = e
            .map_err(|e| ck(dir, e))?
            .file_name()
            .to_string_lossy()
            .into_owned();
        if let Some(rest) = name.strip_prefix(PREFIX)
            && let Some((w, _)) = rest.split_once("_rank_")
            && let Ok(w) = w.parse::<usize>()
        {
            match found {
                Some(f) if f != w => {
                    return Err(ck(
                        dir,
                        format!("optimizer state of world sizes {f} and {w}"),
                    ));
                }
                _ => found = Some(w),
            }
        }
    }
    found.ok_or_else(|| {
        ck(
            dir,
            "no sharded optimizer state (optim_world_size_*_rank_*.safetensors)",
        )
    })
}

/// Writes to `out` the optimizer state of rank `rank` of `world` from the `old`-rank files under
/// `dir`; `numel` gives each unit's unpadded element count by optimizer param name.
pub fn reshard(
    dir: &Path,
    old: usize,
    world: usize,
    rank: usize,
    numel: &HashMap<String, i64>,
    out: &Path,
) -> Result<(), EngineError> {
    let files: Vec<(PathBuf, Vec<u8>)> = (0..old)
        .map(|r| {
            let p = optim_file(dir, old, r);
            std::fs::read(&p)
                .map(|b| (p.clone(), b))
                .map_err(|e| ck(&p, e))
        })
        .collect::<Result<_, _>>()?;
    let parsed: Vec<SafeTensors<'_>> = files
        .iter()
        .map(|(p, b)| SafeTensors::deserialize(b).map_err(|e| ck(p, format!("{e:?}"))))
        .collect::<Result<_, _>>()?;
    let (p0, b0) = &files[0];
    let (_, meta) = SafeTensors::read_metadata(b0).map_err(|e| ck(p0, format!("{e:?}")))?;
    let info = meta.metadata().clone();
    let mut names: Vec<String> = parsed[0].names().into_iter().cloned().collect();
    names.sort();
    let mut data: Vec<(String, Vec<u8>, usize)> = Vec::with_capacity(names.len());
    for name in names {
        let (param, _) = name
            .rsplit_once('.')
            .ok_or_else(|| ck(p0, format!("unexpected tensor `{name}`")))?;
        let n = *numel
            .get(param)
            .ok_or_else(|| ck(p0, format!("`{param}` is not a unit of this model")))?
            as usize;
        let mut flat: Vec<u8> = Vec::with_capacity(n * 4 + 64);
        for (st, (p, _)) in parsed.iter().zip(&files) {
            let t = st
                .tensor(&name)
                .map_err(|e| ck(p, format!("`{name}`: {e:?}")))?;
            if t.dtype() != Dtype::F32 {
                return Err(ck(p, format!("`{name}` is {:?}, expected F32", t.dtype())));
            }
            flat.extend_from_slice(t.data());
        }
        if flat.len() < n * 4 {
            return Err(ck(
                p0,
                format!(
                    "`{name}` has {} elements over {old} ranks, the unit has {n}",
                    flat.len() / 4
                ),
            ));
        }
        flat.truncate(n * 4);
        let shard = n.div_ceil(world.max(1));
        flat.resize(shard * world * 4, 0);
        let mine = flat[rank * shard * 4..(rank + 1) * shard * 4].to_vec();
        data.push((name, mine, shard));
    }
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(n, d, len)| {
            TensorView::new(Dtype::F32, vec![*len], d)
                .map(|v| (n.clone(), v))
                .map_err(|e| ck(out, format!("{e:?}")))
        })
        .collect::<Result<_, _>>()?;
    safetensors::tensor::serialize_to_file(views.iter().map(|(n, v)| (n.as_str(), v)), &info, out)
        .map_err(|e| ck(out, format!("write: {e:?}")))?;
    Ok(())
}
