//! Optimizer checkpoints: one safetensors file with the fp32 main params and optimizer state
//! keyed by model param name, plus JSON metadata (group options, per-param step counters,
//! grad scaler, lr scheduler) for an exact resume.
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, View};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::inner::{InnerConfig, SlotState};
use super::optimizer::{Optimizer, Storage};
use super::param_groups::GroupOptions;
use super::sched::LrScheduler;
use super::{OptimError, Result};
use crate::ops;

const META_KEY: &str = "verlc_optimizer";
const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Meta {
    version: u32,
    precision: crate::optim::Dtype,
    inner: InnerConfig,
    groups: Vec<GroupMeta>,
    /// Completed optimizer steps per param (torch keeps one counter per param).
    steps: BTreeMap<String, u64>,
    /// The grad scaler's state, as the scaler saves it.
    scaler: Option<serde_json::Value>,
    scheduler: Option<LrScheduler>,
}

#[derive(Serialize, Deserialize)]
struct GroupMeta {
    options: GroupOptions,
    params: Vec<String>,
}

/// An fp32 CPU copy of a tensor, as safetensors bytes.
struct F32Bytes {
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &F32Bytes {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn to_bytes(t: &Tensor) -> Result<F32Bytes> {
    let t = t
        .f_detach()?
        .f_to_device(Device::Cpu)?
        .f_to_kind(Kind::Float)?
        .f_contiguous()?;
    let numel = t.numel();
    let mut data = vec![0u8; numel * 4];
    t.f_copy_data_u8(&mut data, numel)?;
    Ok(F32Bytes {
        shape: t.size().iter().map(|&d| d as usize).collect(),
        data,
    })
}

/// Views of one model param's slice of a slot tensor (the flat buffer or the tensor itself).
fn member_view(slot_tensor: &Tensor, offset: Option<i64>, like: &Tensor) -> Result<Tensor> {
    Ok(match offset {
        Some(off) => slot_tensor
            .f_narrow(0, off, like.numel() as i64)?
            .f_view(like.size().as_slice())?,
        None => slot_tensor.shallow_clone(),
    })
}

/// One row per model param: (group, name, main tensor, slot index, offset in a flat slot).
struct Entry {
    name: String,
    main: Tensor,
    chunk: usize,
    slot: usize,
    offset: Option<i64>,
}

impl Optimizer {
    fn entries(&self, g: usize) -> Vec<Entry> {
        let gd = &self.groups[g];
        let mut out = Vec::new();
        for (ci, c) in gd.chunks.iter().enumerate() {
            match &c.storage {
                Storage::Flat { members, .. } => out.extend(members.iter().map(|m| Entry {
                    name: gd.params[m.param].name.clone(),
                    main: m.main.shallow_clone(),
                    chunk: ci,
                    slot: 0,
                    offset: Some(m.offset),
                })),
                Storage::Aliased { members } => {
                    out.extend(members.iter().enumerate().map(|(s, &i)| Entry {
                        name: gd.params[i].name.clone(),
                        main: gd.params[i].tensor.detach(),
                        chunk: ci,
                        slot: s,
                        offset: None,
                    }))
                }
            }
        }
        out
    }

    /// One state tensor of a model param by name (`exp_avg`, `exp_avg_sq` or
    /// `momentum_buffer`), as a view shaped like the param; None if there is none.
    pub fn state_tensor(&self, name: &str, key: &str) -> Option<Tensor> {
        (0..self.groups.len()).find_map(|g| {
            let e = self.entries(g).into_iter().find(|e| e.name == name)?;
            let slot = match (&self.groups[g].chunks[e.chunk].slots[e.slot], key) {
                (SlotState::Adam { exp_avg, .. }, "exp_avg") => exp_avg,
                (SlotState::Adam { exp_avg_sq, .. }, "exp_avg_sq") => exp_avg_sq,
                (
                    SlotState::Sgd {
                        momentum_buffer: Some(b),
                        ..
                    },
                    "momentum_buffer",
                ) => b,
                _ => return None,
            };
            member_view(slot, e.offset, &e.main).ok()
        })
    }

    /// Writes the optimizer's state, its schedule's with it, to `path` atomically (temp file
    /// + rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let ck = |message: String| OptimError::Checkpoint {
            path: path.to_path_buf(),
            message,
        };
        let mut tensors: Vec<(String, F32Bytes)> = Vec::new();
        let mut steps = BTreeMap::new();
        let mut groups = Vec::new();
        for (g, gd) in self.groups.iter().enumerate() {
            groups.push(GroupMeta {
                options: self.options[g].clone(),
                params: gd.params.iter().map(|p| p.name.clone()).collect(),
            });
            for e in self.entries(g) {
                let slot = &gd.chunks[e.chunk].slots[e.slot];
                tensors.push((format!("{}.main", e.name), to_bytes(&e.main)?));
                steps.insert(e.name.clone(), slot.step_count()?);
                match slot {
                    SlotState::Adam {
                        exp_avg,
                        exp_avg_sq,
                        ..
                    } => {
                        tensors.push((
                            format!("{}.exp_avg", e.name),
                            to_bytes(&member_view(exp_avg, e.offset, &e.main)?)?,
                        ));
                        tensors.push((
                            format!("{}.exp_avg_sq", e.name),
                            to_bytes(&member_view(exp_avg_sq, e.offset, &e.main)?)?,
                        ));
                    }
                    SlotState::Sgd {
                        momentum_buffer: Some(b),
                        ..
                    } => {
                        tensors.push((
                            format!("{}.momentum_buffer", e.name),
                            to_bytes(&member_view(b, e.offset, &e.main)?)?,
                        ));
                    }
                    SlotState::Sgd {
                        momentum_buffer: None,
                        ..
                    } => {}
                }
            }
        }
        let meta = Meta {
            version: FORMAT_VERSION,
            precision: self.config.precision,
            inner: self.config.inner,
            groups,
            steps,
            scaler: self.scaler.as_ref().map(|s| s.save()).transpose()?,
            scheduler: self.scheduler.clone(),
        };
        let json = serde_json::to_string(&meta).map_err(|e| ck(e.to_string()))?;
        let info = Some(HashMap::from([(META_KEY.to_owned(), json)]));
        let tmp = path.with_extension("tmp");
        safetensors::tensor::serialize_to_file(
            tensors.iter().map(|(n, b)| (n.as_str(), b)),
            &info,
            &tmp,
        )
        .map_err(|e| ck(format!("write: {e:?}")))?;
        std::fs::rename(&tmp, path).map_err(|e| ck(format!("rename: {e}")))?;
        Ok(())
    }

    /// Restores a [`save`](Self::save)d state into this optimizer (same params, any offload
    /// split) with its schedule, and copies the main params into the model params. An
    /// optimizer with a schedule refuses a state saved without one.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let ck = |message: String| OptimError::Checkpoint {
            path: path.to_path_buf(),
            message,
        };
        let bytes = std::fs::read(path).map_err(|e| ck(e.to_string()))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| ck(format!("{e:?}")))?;
        let json = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(META_KEY))
            .ok_or_else(|| {
                ck(format!(
                    "no {META_KEY} metadata: not an optimizer checkpoint"
                ))
            })?;
        let meta: Meta = serde_json::from_str(json).map_err(|e| ck(format!("metadata: {e}")))?;
        if meta.version != FORMAT_VERSION {
            return Err(ck(format!(
                "format version {} (expected {FORMAT_VERSION})",
                meta.version
            )));
        }
        if self.scheduler.is_some() && meta.scheduler.is_none() {
            return Err(ck("no lr scheduler state (saved without a schedule)".into()));
        }
        let same_rule = matches!(
            (meta.inner, self.config.inner),
            (InnerConfig::AdamW(_), InnerConfig::AdamW(_))
                | (InnerConfig::Sgd(_), InnerConfig::Sgd(_))
        );
        if !same_rule {
            return Err(ck(format!(
                "saved with {:?}, loading into {:?}",
                meta.inner, self.config.inner
            )));
        }
        if meta.groups.len() != self.groups.len() {
            return Err(ck(format!(
                "{} param groups saved, {} here",
                meta.groups.len(),
                self.groups.len()
            )));
        }
        for (g, (saved, gd)) in meta.groups.iter().zip(&self.groups).enumerate() {
            let here: Vec<&str> = gd.params.iter().map(|p| p.name.as_str()).collect();
            if saved.params.iter().map(String::as_str).collect::<Vec<_>>() != here {
                return Err(ck(format!(
                    "group {g} params differ: saved {:?}, here {:?}",
                    saved.params, here
                )));
            }
        }
        let st = SafeTensors::deserialize(&bytes).map_err(|e| ck(format!("{e:?}")))?;
        let read = |key: &str, like: &Tensor| -> Result<Option<Tensor>> {
            let view = match st.tensor(key) {
                Ok(v) => v,
                Err(_) => return Ok(None),
            };
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            if shape != like.size() || view.dtype() != Dtype::F32 {
                return Err(ck(format!(
                    "{key}: saved {:?} {shape:?}, expected F32 {:?}",
                    view.dtype(),
                    like.size()
                )));
            }
            Ok(Some(Tensor::f_from_data_size(
                view.data(),
                &shape,
                Kind::Float,
            )?))
        };
        let need = |key: &str, like: &Tensor| -> Result<Tensor> {
            read(key, like)?.ok_or_else(|| ck(format!("missing tensor {key}")))
        };

        tch::no_grad(|| -> Result<()> {
            for g in 0..self.groups.len() {
                let entries = self.entries(g);
                // Steps: a flat slot is shared by its members, whose counters must agree.
                let mut slot_steps: HashMap<(usize, usize), u64> = HashMap::new();
                for e in &entries {
                    let s = *meta
                        .steps
                        .get(&e.name)
                        .ok_or_else(|| ck(format!("no step counter for {}", e.name)))?;
                    if let Some(prev) = slot_steps.insert((e.chunk, e.slot), s)
                        && prev != s
                    {
                        return Err(ck(format!(
                            "{}: step {s} differs from its buffer's {prev}",
                            e.name
                        )));
                    }
                }
                for e in &entries {
                    e.main
                        .shallow_clone()
                        .f_copy_(&need(&format!("{}.main", e.name), &e.main)?)?;
                    let slot = &mut self.groups[g].chunks[e.chunk].slots[e.slot];
                    slot.set_step_count(slot_steps[&(e.chunk, e.slot)])?;
                    match slot {
                        SlotState::Adam {
                            exp_avg,
                            exp_avg_sq,
                            ..
                        } => {
                            member_view(exp_avg, e.offset, &e.main)?
                                .f_copy_(&need(&format!("{}.exp_avg", e.name), &e.main)?)?;
                            member_view(exp_avg_sq, e.offset, &e.main)?
                                .f_copy_(&need(&format!("{}.exp_avg_sq", e.name), &e.main)?)?;
                        }
                        SlotState::Sgd {
                            momentum_buffer, ..
                        } => {
                            match read(&format!("{}.momentum_buffer", e.name), &e.main)? {
                                Some(saved) => {
                                    if momentum_buffer.is_none() {
                                        let like = match &self.groups[g].chunks[e.chunk].storage {
                                            Storage::Flat { main, .. } => main.f_zeros_like()?,
                                            Storage::Aliased { .. } => e.main.f_zeros_like()?,
                                        };
                                        // Re-borrow after reading the storage.
                                        if let SlotState::Sgd {
                                            momentum_buffer, ..
                                        } = &mut self.groups[g].chunks[e.chunk].slots[e.slot]
                                        {
                                            *momentum_buffer = Some(like);
                                        }
                                    }
                                    if let SlotState::Sgd {
                                        momentum_buffer: Some(b),
                                        ..
                                    } = &self.groups[g].chunks[e.chunk].slots[e.slot]
                                    {
                                        member_view(b, e.offset, &e.main)?.f_copy_(&saved)?;
                                    }
                                }
                                None => *momentum_buffer = None,
                            }
                        }
                    }
                }
            }
            Ok(())
        })?;
        for (o, saved) in self.options.iter_mut().zip(&meta.groups) {
            *o = saved.options.clone();
        }
        if let (Some(s), Some(saved)) = (&mut self.scaler, meta.scaler) {
            s.restore(saved)?;
        }
        // Model params follow their restored main params (fp32 -> bf16/fp16 rounding).
        tch::no_grad(|| -> Result<()> {
            for gd in &self.groups {
                for c in &gd.chunks {
                    if let Storage::Flat { members, .. } = &c.storage {
                        let dst: Vec<Tensor> = members
                            .iter()
                            .map(|m| gd.params[m.param].tensor.detach())
                            .collect();
                        let src: Vec<Tensor> =
                            members.iter().map(|m| m.main.shallow_clone()).collect();
                        ops::foreach_copy(&dst, &src, false)?;
                    }
                }
            }
            Ok(())
        })?;
        if let Some(s) = meta.scheduler {
            self.set_scheduler(s);
        }
        Ok(())
    }
}
