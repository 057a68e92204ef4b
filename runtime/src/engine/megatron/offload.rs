//! Parameter and gradient offload for the Megatron engine (verl's megatron workers'
//! `param_offload` / `grad_offload`): between phases the weights (and the distributed
//! optimizer's param buffer) and the gradient buffers live in host memory, and their device
//! memory is freed; a phase that needs them copies them back first.
//!
//! What is freed is the storage itself (torch's `untyped_storage().resize_(0)`), not the tensor
//! handle: every view of it (the distributed optimizer's fp32 pieces view its param buffer, its
//! grads view the grad shard) keeps pointing at the same storage, which gets fresh memory and
//! its contents back on [`Parked::restore`]. On CUDA the host copies are pinned. On CPU the
//! "device" is host memory too: the move is then a copy into a separate host buffer and the
//! release of the original, which tests measure as bytes leaving the device storages.
use std::cell::RefCell;

use tch::{Device, Tensor};

use super::{MegatronError, Result};

use crate::ops::storage_bytes;

fn shim(op: &str, r: crate::ops::Result<()>) -> Result<()> {
    r.map_err(|e| MegatronError::Config(format!("offload ({op}): {e}")))
}

/// Tensors whose device storage was freed, with their contents in host memory.
#[derive(Debug, Default)]
pub struct Parked {
    items: Vec<(Tensor, Tensor, usize)>,
}

impl Parked {
    /// Copies each tensor to host memory and frees its storage. Each tensor must be the whole
    /// of its storage (a parameter, a gradient, a flat buffer); undefined and already-freed
    /// tensors are skipped.
    pub fn park(tensors: Vec<Tensor>) -> Result<Self> {
        let mut items = Vec::with_capacity(tensors.len());
        for t in tensors {
            let nbytes = storage_bytes(&t);
            if nbytes == 0 {
                continue;
            }
            let whole = t.numel() * t.kind().elt_size_in_bytes();
            if t.storage_offset() != 0 || whole != nbytes || !t.is_contiguous() {
                return Err(MegatronError::Config(format!(
                    "offload: a tensor of {whole} bytes is a view into a storage of {nbytes}"
                )));
            }
            let host = match t.device() {
                Device::Cpu => Tensor::f_empty(t.size(), (t.kind(), Device::Cpu))?,
                d => Tensor::f_empty(t.size(), (t.kind(), Device::Cpu))?.f_pin_memory(d)?,
            };
            tch::no_grad(|| host.shallow_clone().f_copy_(&t))?;
            // Every view of `t` is left without data until `restore`.
            shim("free", crate::ops::free_storage(&t))?;
            items.push((t, host, nbytes));
        }
        Ok(Parked { items })
    }

    /// Gives every parked storage its memory back and copies the contents in.
    pub fn restore(self) -> Result<()> {
        for (t, host, nbytes) in self.items {
            shim("alloc", crate::ops::alloc_storage(&t, nbytes))?;
            tch::no_grad(|| t.shallow_clone().f_copy_(&host))?;
        }
        Ok(())
    }

    /// Bytes held in host memory.
    pub fn host_bytes(&self) -> usize {
        self.items.iter().map(|(_, _, n)| n).sum()
    }
}

/// One kind of offloadable tensors (the parameters, or the gradient buffers): whether offload
/// is on for it, and what is parked now.
#[derive(Debug, Default)]
pub struct OffloadSlot {
    on: bool,
    parked: RefCell<Option<Parked>>,
}

impl OffloadSlot {
    pub fn new(on: bool) -> Self {
        OffloadSlot {
            on,
            parked: RefCell::new(None),
        }
    }

    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Parks `tensors()` when offload is on and nothing is parked yet.
    pub fn park(&self, tensors: impl FnOnce() -> Vec<Tensor>) -> Result<()> {
        let mut slot = self.parked.borrow_mut();
        if self.on && slot.is_none() {
            *slot = Some(Parked::park(tensors())?);
        }
        Ok(())
    }

    /// Brings what is parked back to the device.
    pub fn bring(&self) -> Result<()> {
        match self.parked.borrow_mut().take() {
            Some(p) => p.restore(),
            None => Ok(()),
        }
    }

    /// Bytes parked in host memory now.
    pub fn host_bytes(&self) -> usize {
        self.parked.borrow().as_ref().map_or(0, Parked::host_bytes)
    }
}
