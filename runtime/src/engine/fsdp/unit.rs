//! [`FlatUnit`]: one FSDP unit (a decoder layer, or the root: embeddings, final norm, head).
//!
//! The unit's parameters are flattened, in a fixed order, into one vector of the main dtype
//! (fp32, or bf16 for a model trained in bf16) padded to a multiple of the group size; each rank keeps its contiguous 1/N slice (the *shard*) as a leaf
//! tensor the optimizer steps. The module's own parameter tensors own no memory except while
//! the unit is gathered: [`FlatUnit::gather`] all-gathers the shards in the compute dtype and
//! points each parameter at its view of the full buffer (`param.data = view`, as FSDP1 does);
//! [`FlatUnit::free`] points them at an empty tensor again. Gradients that autograd accumulated
//! into the parameters are flattened in the reduce dtype and reduce-scattered (summed; the
//! engine pre-divides the loss) into the shard's `.grad` by [`FlatUnit::reduce_grads`].
//!
//! A *frozen* unit (the base weights under LoRA) holds parameters that never get gradients:
//! they do not require grad, its shard is no optimizer parameter and nothing is reduced
//! (PyTorch FSDP likewise wants one `requires_grad` per flat parameter, which is why verl
//! wraps LoRA modules in their own units). [`UnitSet`] is the units of one decoder layer.

use tch::{Device, Kind, Tensor};

use crate::ops;
use crate::parallel::dist::{ProcessGroup, ReduceOp};

use super::FsdpError;

/// Where a unit's shard lives and its dtype (the main dtype the optimizer steps).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShardPlace {
    pub device: Device,
    pub kind: Kind,
}

/// One parameter of a unit: the module's tensor and its place in the flat vector.
struct Member {
    name: String,
    var: Tensor,
    shape: Vec<i64>,
    offset: i64,
    numel: i64,
}

/// A flat-parameter FSDP unit; see the module docs.
pub struct FlatUnit {
    name: String,
    members: Vec<Member>,
    /// Elements of the unpadded flat vector.
    numel: i64,
    /// Elements per rank (the padded vector has `shard_len * world` elements).
    shard_len: i64,
    world: i64,
    /// This rank's slice in the main dtype (leaf, requires grad; `.grad` holds the reduced
    /// gradient, in the same dtype).
    shard: Tensor,
    /// The full flat buffer in the compute dtype while the unit is gathered.
    gathered: Option<Tensor>,
    compute_kind: Kind,
    compute_device: Device,
    trainable: bool,
}

impl std::fmt::Debug for FlatUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlatUnit")
            .field("name", &self.name)
            .field("numel", &self.numel)
            .field("shard_len", &self.shard_len)
            .field("gathered", &self.gathered.is_some())
            .field("trainable", &self.trainable)
            .finish_non_exhaustive()
    }
}

fn torch(e: tch::TchError) -> FsdpError {
    FsdpError::Torch(e)
}

impl FlatUnit {
    /// Builds the unit from the module's (full, initialised) parameters `vars` and frees them.
    /// `rank`/`world` place this rank's slice; the shard lives on `place.device` in
    /// `place.kind`. A unit that is not `trainable` is frozen (see the module docs).
    pub fn new(
        name: &str,
        vars: Vec<(String, Tensor)>,
        (rank, world): (usize, usize),
        place: ShardPlace,
        trainable: bool,
    ) -> Result<Self, FsdpError> {
        let ShardPlace {
            device: shard_device,
            kind: main_kind,
        } = place;
        let Some(first) = vars.first() else {
            return Err(FsdpError::Config(format!(
                "FSDP unit `{name}` has no parameters"
            )));
        };
        let (compute_kind, compute_device) = (first.1.kind(), first.1.device());
        let mut members = Vec::with_capacity(vars.len());
        let mut offset = 0i64;
        for (n, var) in vars {
            if var.kind() != compute_kind || var.device() != compute_device {
                return Err(FsdpError::Config(format!(
                    "parameter `{n}` is {:?} on {:?}; unit `{name}` is {compute_kind:?} on {compute_device:?}",
                    var.kind(),
                    var.device()
                )));
            }
            let numel = var.numel() as i64;
            members.push(Member {
                name: n,
                shape: var.size(),
                var,
                offset,
                numel,
            });
            offset += numel;
        }
        let world_i = world.max(1) as i64;
        let shard_len = (offset + world_i - 1) / world_i;
        let shard = tch::no_grad(|| -> Result<Tensor, tch::TchError> {
            let parts: Vec<Tensor> = members
                .iter()
                .map(|m| m.var.f_detach()?.f_reshape([-1])?.f_to_kind(main_kind))
                .collect::<Result<_, _>>()?;
            let mut flat = Tensor::f_cat(&parts, 0)?;
            let pad = shard_len * world_i - offset;
            if pad > 0 {
                flat = Tensor::f_cat(
                    &[flat, Tensor::f_zeros([pad], (main_kind, compute_device))?],
                    0,
                )?;
            }
            // A fresh tensor (not a view of the padded vector), so only the shard stays alive.
            fresh(
                &flat
                    .f_narrow(0, rank as i64 * shard_len, shard_len)?
                    .f_to_device(shard_device)?,
            )
        })
        .map_err(torch)?
        .set_requires_grad(trainable);
        if !trainable {
            for m in &members {
                let _ = m.var.shallow_clone().set_requires_grad(false);
            }
        }
        let mut unit = FlatUnit {
            name: name.to_owned(),
            members,
            numel: offset,
            shard_len,
            world: world_i,
            shard,
            gathered: None,
            compute_kind,
            compute_device,
            trainable,
        };
        unit.free()?;
        Ok(unit)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shard the optimizer steps.
    pub fn shard(&self) -> &Tensor {
        &self.shard
    }

    pub fn numel(&self) -> i64 {
        self.numel
    }

    /// Whether the shard is an optimizer parameter (false for a frozen unit).
    pub fn trainable(&self) -> bool {
        self.trainable
    }

    pub fn is_gathered(&self) -> bool {
        self.gathered.is_some()
    }

    /// Bytes of the full flat buffer while gathered (0 when freed).
    pub fn gathered_bytes(&self) -> i64 {
        self.gathered.as_ref().map_or(0, crate::ops::tensor_bytes)
    }

    /// The parameter names of the unit, in flat order.
    pub fn param_names(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|m| m.name.as_str())
    }

    /// All-gathers the full flat vector in the compute dtype (a new tensor).
    fn all_gather(&self, group: &ProcessGroup) -> Result<Tensor, FsdpError> {
        let full = Tensor::f_zeros(
            [self.shard_len * self.world],
            (self.compute_kind, self.compute_device),
        )
        .map_err(torch)?;
        let local = self
            .shard
            .f_detach()
            .and_then(|t| t.f_to_device(self.compute_device))
            .and_then(|t| t.f_to_kind(self.compute_kind))
            .map_err(torch)?;
        group.all_gather_into(&full, &local)?;
        Ok(full)
    }

    /// Materialises the unit's parameters (no-op when already gathered).
    pub fn gather(&mut self, group: &ProcessGroup) -> Result<(), FsdpError> {
        if self.gathered.is_some() {
            return Ok(());
        }
        let full = self.all_gather(group)?;
        for m in &mut self.members {
            let view = full
                .f_narrow(0, m.offset, m.numel)
                .and_then(|v| v.f_view(m.shape.as_slice()))
                .map_err(torch)?;
            m.var.f_set_data(&view).map_err(torch)?;
        }
        self.gathered = Some(full);
        Ok(())
    }

    /// Releases the full parameters (the module's tensors become empty).
    pub fn free(&mut self) -> Result<(), FsdpError> {
        for m in &mut self.members {
            let empty =
                Tensor::f_empty([0], (self.compute_kind, self.compute_device)).map_err(torch)?;
            m.var.f_set_data(&empty).map_err(torch)?;
        }
        self.gathered = None;
        Ok(())
    }

    /// The full parameters by name, as fresh tensors (the unit itself stays as it is).
    pub fn full_params(&self, group: &ProcessGroup) -> Result<Vec<(String, Tensor)>, FsdpError> {
        let full = match &self.gathered {
            Some(t) => t.shallow_clone(),
            None => self.all_gather(group)?,
        };
        self.members
            .iter()
            .map(|m| {
                let t = full
                    .f_narrow(0, m.offset, m.numel)
                    .and_then(|v| v.f_view(m.shape.as_slice()))
                    .and_then(|v| fresh(&v.f_detach()?))
                    .map_err(torch)?;
                Ok((m.name.clone(), t))
            })
            .collect()
    }

    /// Overwrites this rank's shard from full parameters by name (e.g. a checkpoint).
    pub fn load_full(
        &mut self,
        rank: usize,
        get: &dyn Fn(&str) -> Option<Tensor>,
    ) -> Result<(), FsdpError> {
        let mut parts = Vec::with_capacity(self.members.len() + 1);
        for m in &self.members {
            let t = get(&m.name)
                .ok_or_else(|| FsdpError::Config(format!("no tensor `{}` to load", m.name)))?;
            if t.size() != m.shape {
                return Err(FsdpError::Config(format!(
                    "tensor `{}` has shape {:?}, the model expects {:?}",
                    m.name,
                    t.size(),
                    m.shape
                )));
            }
            parts.push(
                t.f_reshape([-1])
                    .and_then(|t| t.f_to_kind(self.shard.kind()))
                    .map_err(torch)?,
            );
        }
        let pad = self.shard_len * self.world - self.numel;
        if pad > 0 {
            parts.push(Tensor::f_zeros([pad], (self.shard.kind(), Device::Cpu)).map_err(torch)?);
        }
        tch::no_grad(|| -> Result<(), tch::TchError> {
            let parts: Vec<Tensor> = parts
                .iter()
                .map(|p| p.f_to_device(Device::Cpu))
                .collect::<Result<_, _>>()?;
            let flat = Tensor::f_cat(&parts, 0)?;
            let mine = flat.f_narrow(0, rank as i64 * self.shard_len, self.shard_len)?;
            self.shard.shallow_clone().f_copy_(&mine)?;
            Ok(())
        })
        .map_err(torch)?;
        if self.gathered.is_some() {
            self.gathered = None;
        }
        Ok(())
    }

    /// Flattens the gradients autograd accumulated into the parameters (in `reduce_kind`),
    /// reduce-scatters their sum over `group` and adds this rank's slice to the shard's
    /// `.grad`. The parameters' own gradients are released.
    pub fn reduce_grads(
        &mut self,
        group: &ProcessGroup,
        reduce_kind: Kind,
    ) -> Result<(), FsdpError> {
        if !self.trainable {
            return Ok(());
        }
        let flat = Tensor::f_zeros(
            [self.shard_len * self.world],
            (reduce_kind, self.compute_device),
        )
        .map_err(torch)?;
        tch::no_grad(|| -> Result<(), FsdpError> {
            for m in &self.members {
                let g = m.var.grad();
                if g.defined() {
                    flat.f_narrow(0, m.offset, m.numel)
                        .and_then(|mut dst| dst.f_copy_(&g.f_reshape([-1])?))
                        .map_err(torch)?;
                }
                ops::set_grad(&m.var, None)?;
            }
            Ok(())
        })?;
        let out =
            Tensor::f_zeros([self.shard_len], (reduce_kind, self.compute_device)).map_err(torch)?;
        group.reduce_scatter(&out, &flat, ReduceOp::Sum)?;
        drop(flat);
        let out = out
            .f_to_kind(self.shard.kind())
            .and_then(|t| t.f_to_device(self.shard.device()))
            .map_err(torch)?;
        let current = self.shard.grad();
        if current.defined() {
            let _ = tch::no_grad(|| current.shallow_clone().f_add_(&out)).map_err(torch)?;
        } else {
            ops::set_grad(&self.shard, Some(&out))?;
        }
        Ok(())
    }
}

/// The units of one decoder layer: its frozen base and trainable adapters under LoRA, else
/// one unit. Every operation applies to each unit in order.
#[derive(Debug)]
pub struct UnitSet(pub Vec<FlatUnit>);

impl UnitSet {
    pub fn iter(&self) -> impl Iterator<Item = &FlatUnit> {
        self.0.iter()
    }

    pub fn gather(&mut self, group: &ProcessGroup) -> Result<(), FsdpError> {
        self.0.iter_mut().try_for_each(|u| u.gather(group))
    }

    pub fn free(&mut self) -> Result<(), FsdpError> {
        self.0.iter_mut().try_for_each(FlatUnit::free)
    }

    pub fn reduce_grads(&mut self, group: &ProcessGroup, kind: Kind) -> Result<(), FsdpError> {
        self.0
            .iter_mut()
            .try_for_each(|u| u.reduce_grads(group, kind))
    }

    pub fn load_full(
        &mut self,
        rank: usize,
        get: &dyn Fn(&str) -> Option<Tensor>,
    ) -> Result<(), FsdpError> {
        self.0.iter_mut().try_for_each(|u| u.load_full(rank, get))
    }
}

/// A copy of `x` with its own storage.
fn fresh(x: &Tensor) -> Result<Tensor, tch::TchError> {
    let mut t = x.f_empty_like()?;
    t.f_copy_(x)?;
    Ok(t)
}
