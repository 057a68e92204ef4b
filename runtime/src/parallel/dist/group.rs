//! [`ProcessGroup`]: a c10d backend (Gloo or NCCL) plus the ranks it spans.
use std::ffi::CString;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tch::{Device, Tensor};

use super::store::{Store, millis};
use super::{DEFAULT_TIMEOUT, DistEnv, DistError, Result};
use crate::ffi;
use crate::model::rank_group::CollectiveError;

/// Which c10d backend a group runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// ProcessGroupGloo: CPU tensors, TCP transport.
    Gloo,
    /// ProcessGroupNCCL: CUDA tensors (needs the `cuda` feature).
    Nccl,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        })
    }
}

impl Backend {
    /// Whether this build can create groups of this backend.
    pub fn is_available(self) -> bool {
        match self {
            Backend::Gloo => true,
            // SAFETY: pure query.
            Backend::Nccl => unsafe { ffi::vlc_has_nccl() != 0 },
        }
    }
}

/// What the pacing of Gloo's event-loop threads did in this process (`csrc/gloo_pacing.cpp`):
/// a loop thread that woke for a socket it could not read yet (another thread held the pair)
/// yields before waiting again, instead of spinning on the CPU that thread needs.
/// `VERLC_GLOO_PACING=0` turns the yielding off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlooPacing {
    /// epoll waits of Gloo loop threads seen (zero would mean the pacing is not linked in).
    pub waits: u64,
    /// Of those, the ones that yielded first.
    pub yields: u64,
}

impl GlooPacing {
    /// The process's totals so far.
    pub fn now() -> GlooPacing {
        let (mut waits, mut yields) = (0, 0);
        // SAFETY: two out-pointers to live u64s.
        unsafe { ffi::vlc_gloo_pacing_stats(&mut waits, &mut yields) };
        GlooPacing { waits, yields }
    }
}

/// Reduction of [`ProcessGroup::all_reduce`] / [`ProcessGroup::reduce_scatter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// Mean over the group (Gloo: sum then divide; floating-point tensors only).
    Avg,
    Max,
    Min,
    Product,
}

impl ReduceOp {
    fn code(self) -> i32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Avg => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Product => 4,
        }
    }
}

/// Which address the Gloo transport binds (torch: GLOO_SOCKET_IFNAME or the hostname).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GlooDevice {
    /// GLOO_SOCKET_IFNAME if set, else the address this host's name resolves to, else loopback.
    #[default]
    Auto,
    Interface(String),
    Hostname(String),
}

/// How [`ProcessGroup::init`] builds the world group.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub backend: Backend,
    /// Bound on rendezvous and on every collective.
    pub timeout: Duration,
    pub gloo_device: GlooDevice,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            backend: Backend::Gloo,
            timeout: DEFAULT_TIMEOUT,
            gloo_device: GlooDevice::Auto,
        }
    }
}

/// Worker threads of a Gloo group (each with its own connections to every peer). Every
/// collective here is waited for before the next starts, so a second thread (torch's default)
/// never runs one beside the first: it only doubles the connections a group opens and the
/// threads that wake per message (on 2 CPU ranks the examples' 58 runs took 4% less CPU with
/// one).
const GLOO_THREADS: i32 = 1;

/// A group of ranks that run collectives together. Cheap to clone (shared handle); pass it
/// by reference to whatever communicates.
///
/// Ranks in arguments (`root`, `dst`, `src`, `new_group`) are ranks *within this group*;
/// [`global_ranks`](Self::global_ranks) maps them to world ranks.
#[derive(Clone)]
pub struct ProcessGroup {
    inner: Arc<GroupInner>,
}

struct GroupInner {
    pg: NonNull<ffi::vlc_pg>,
    /// The root (un-prefixed) store; sub-groups rendezvous under their own prefix of it.
    root_store: Store,
    name: String,
    rank: usize,
    global_ranks: Vec<usize>,
    backend: Backend,
    device: Device,
    timeout: Duration,
    gloo_device: GlooDevice,
    /// Sub-groups created so far; every member creates them in the same order, so the
    /// counter names each one identically on all ranks (torch does the same).
    next_subgroup: AtomicU64,
}

// SAFETY: c10d backends are designed to be called from any thread (torch's Python front end
// does); the handle itself is only freed in Drop.
unsafe impl Send for GroupInner {}
unsafe impl Sync for GroupInner {}

impl Drop for GroupInner {
    fn drop(&mut self) {
        // SAFETY: created by vlc_pg_*_new, freed once.
        unsafe { ffi::vlc_pg_free(self.pg.as_ptr()) }
    }
}

impl fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("name", &self.inner.name)
            .field("backend", &self.inner.backend)
            .field("rank", &self.inner.rank)
            .field("global_ranks", &self.inner.global_ranks)
            .finish()
    }
}

impl ProcessGroup {
    /// The world group of the job described by `env` (rendezvous over TCPStore at
    /// MASTER_ADDR:MASTER_PORT, rank 0 serving unless torchrun's agent does).
    pub fn init(env: &DistEnv, opts: &InitOptions) -> Result<Self> {
        if !opts.backend.is_available() {
            return Err(DistError::Init {
                backend: opts.backend,
                rank: env.rank,
                size: env.world_size,
                message: "this build has no NCCL (enable the `cuda` feature of verlc-runtime)"
                    .into(),
            });
        }
        let store = Store::tcp(
            &env.master_addr,
            env.master_port,
            env.world_size,
            env.rank == 0 && !env.agent_store,
            opts.timeout,
        )?;
        let device = match opts.backend {
            Backend::Gloo => Device::Cpu,
            Backend::Nccl => Device::Cuda(env.local_rank),
        };
        let global_ranks: Vec<usize> = (0..env.world_size).collect();
        Self::create(
            store,
            "world".into(),
            env.rank,
            global_ranks,
            opts.backend,
            device,
            opts.timeout,
            opts.gloo_device.clone(),
        )
    }

    /// [`init`](Self::init) from torchrun's environment; a single-process group when no
    /// launcher set RANK / WORLD_SIZE.
    pub fn init_from_env(opts: &InitOptions) -> Result<Self> {
        let env = DistEnv::from_env()?.unwrap_or_else(DistEnv::single);
        Self::init(&env, opts)
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        root_store: Store,
        name: String,
        rank: usize,
        global_ranks: Vec<usize>,
        backend: Backend,
        device: Device,
        timeout: Duration,
        gloo_device: GlooDevice,
    ) -> Result<Self> {
        let size = global_ranks.len();
        let init_err = |message: String| DistError::Init {
            backend,
            rank,
            size,
            message,
        };
        let store = root_store.prefixed(&format!("{name}/"))?;
        let (r, s) = (to_i32(rank)?, to_i32(size)?);
        let mut out = std::ptr::null_mut();
        let err = match backend {
            Backend::Gloo => {
                let env_iface = std::env::var("GLOO_SOCKET_IFNAME")
                    .ok()
                    .filter(|s| !s.is_empty());
                let (iface, host) = match &gloo_device {
                    GlooDevice::Auto => (env_iface, None),
                    GlooDevice::Interface(i) => (Some(i.clone()), None),
                    GlooDevice::Hostname(h) => (None, Some(h.clone())),
                };
                let iface = iface
                    .map(CString::new)
                    .transpose()
                    .map_err(|_| init_err("interface name has a NUL byte".into()))?;
                let host = host
                    .map(CString::new)
                    .transpose()
                    .map_err(|_| init_err("hostname has a NUL byte".into()))?;
                let ptr_or_null =
                    |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
                // SAFETY: live store, valid (or null) C strings, out-pointer.
                unsafe {
                    ffi::vlc_pg_gloo_new(
                        store.raw(),
                        r,
                        s,
                        millis(timeout),
                        ptr_or_null(&iface),
                        ptr_or_null(&host),
                        GLOO_THREADS,
                        &mut out,
                    )
                }
            }
            // SAFETY: live store, out-pointer.
            Backend::Nccl => unsafe {
                ffi::vlc_pg_nccl_new(store.raw(), r, s, millis(timeout), &mut out)
            },
        };
        ffi::take_error(err).map_err(init_err)?;
        let pg = NonNull::new(out).ok_or_else(|| init_err("null process group".into()))?;
        Ok(ProcessGroup {
            inner: Arc::new(GroupInner {
                pg,
                root_store,
                name,
                rank,
                global_ranks,
                backend,
                device,
                timeout,
                gloo_device,
                next_subgroup: AtomicU64::new(0),
            }),
        })
    }

    /// This process's rank within the group.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    pub fn size(&self) -> usize {
        self.inner.global_ranks.len()
    }

    /// World rank of each group rank.
    pub fn global_ranks(&self) -> &[usize] {
        &self.inner.global_ranks
    }

    /// The group rank of world rank `global`, if it is a member.
    pub fn group_rank_of(&self, global: usize) -> Option<usize> {
        self.inner.global_ranks.iter().position(|&g| g == global)
    }

    pub fn backend(&self) -> Backend {
        self.inner.backend
    }

    /// Where this group's tensors must live (CPU for Gloo, this rank's GPU for NCCL).
    pub fn device(&self) -> Device {
        self.inner.device
    }

    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The rendezvous store shared by the job.
    pub fn store(&self) -> &Store {
        &self.inner.root_store
    }

    fn raw(&self) -> *mut ffi::vlc_pg {
        self.inner.pg.as_ptr()
    }

    fn check(&self, op: &'static str, err: *mut std::ffi::c_char) -> Result<()> {
        ffi::take_error(err).map_err(|message| DistError::Collective {
            op,
            group: self.inner.name.clone(),
            message,
        })
    }

    fn group_rank_arg(&self, what: &str, r: usize) -> Result<i32> {
        if r >= self.size() {
            return Err(DistError::Invalid(format!(
                "{what} {r} is not a rank of {} (size {})",
                self.inner.name,
                self.size()
            )));
        }
        to_i32(r)
    }

    /// In-place all-reduce of one tensor.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_many(std::slice::from_ref(t), op)
    }

    /// In-place all-reduce of several tensors. Tensors of one dtype and device travel in one
    /// collective (flattened into a temporary buffer and copied back).
    pub fn all_reduce_many(&self, ts: &[Tensor], op: ReduceOp) -> Result<()> {
        self.coalesced("all_reduce", ts, |pg, flat| {
            let ptr = ffi::tptr(flat);
            // SAFETY: `flat` outlives the call; the shim borrows it.
            let err = unsafe { ffi::vlc_pg_allreduce(pg.raw(), &ptr, 1, op.code(), 0) };
            pg.check("all_reduce", err)
        })
    }

    /// Runs `f` on one flat buffer per (dtype, device) bucket of `ts`, then copies the
    /// results back into the tensors.
    fn coalesced(
        &self,
        op: &'static str,
        ts: &[Tensor],
        f: impl Fn(&Self, &Tensor) -> Result<()>,
    ) -> Result<()> {
        let mut buckets: Vec<((tch::Kind, Device), Vec<&Tensor>)> = Vec::new();
        for t in ts {
            let key = (t.kind(), t.device());
            match buckets.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(t),
                None => buckets.push((key, vec![t])),
            }
        }
        let torch_err = |e: tch::TchError| DistError::Collective {
            op,
            group: self.inner.name.clone(),
            message: e.to_string(),
        };
        for (_, members) in buckets {
            if let [single] = members.as_slice()
                && single.is_contiguous()
            {
                f(self, single)?;
                continue;
            }
            // Detached aliases: collectives move data, never autograd history.
            let flats: Vec<Tensor> = members.iter().map(|t| t.detach().reshape([-1])).collect();
            let flat = Tensor::f_cat(&flats, 0).map_err(torch_err)?;
            f(self, &flat)?;
            let mut offset = 0i64;
            for t in members {
                let n = t.numel() as i64;
                let part = flat
                    .f_narrow(0, offset, n)
                    .and_then(|p| p.f_view_as(t))
                    .map_err(torch_err)?;
                let mut dst = t.detach();
                dst.f_copy_(&part).map_err(torch_err)?;
                offset += n;
            }
        }
        Ok(())
    }

    /// Gathers every rank's `input` into `output` (rank-major, `size * numel(input)` elements),
    /// like `torch.distributed.all_gather_into_tensor`.
    pub fn all_gather_into(&self, output: &Tensor, input: &Tensor) -> Result<()> {
        let (on, inn) = (output.numel(), input.numel());
        if on != inn * self.size() {
            return Err(DistError::Invalid(format!(
                "all_gather_into: output has {on} elements, expected {} x {inn}",
                self.size()
            )));
        }
        let (out, inp) = self.flat_pair("all_gather_into", output, input)?;
        // SAFETY: both tensors outlive the call.
        let err =
            unsafe { ffi::vlc_pg_allgather_into(self.raw(), ffi::tptr(&out), ffi::tptr(&inp), 0) };
        self.check("all_gather_into", err)
    }

    /// Reduces `input` (`size * numel(output)` elements) over the group and leaves the
    /// rank-th slice in `output`, like `torch.distributed.reduce_scatter_tensor`.
    pub fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<()> {
        let (on, inn) = (output.numel(), input.numel());
        if inn != on * self.size() {
            return Err(DistError::Invalid(format!(
                "reduce_scatter: input has {inn} elements, expected {} x {on}",
                self.size()
            )));
        }
        let (out, inp) = self.flat_pair("reduce_scatter", output, input)?;
        // SAFETY: both tensors outlive the call.
        let err = unsafe {
            ffi::vlc_pg_reduce_scatter(self.raw(), ffi::tptr(&out), ffi::tptr(&inp), op.code(), 0)
        };
        self.check("reduce_scatter", err)
    }

    /// Ulysses' all-to-all, differentiable: `x` cut into `size` equal chunks along
    /// `scatter_dim`, chunk j to rank j, the received chunks joined along `gather_dim` in rank
    /// order; its gradient is the exchange back. The group must outlive the autograd graph.
    pub fn all_to_all_differentiable(
        &self,
        x: &Tensor,
        scatter_dim: i64,
        gather_dim: i64,
    ) -> Result<Tensor> {
        let mut out: ffi::TensorPtr = std::ptr::null_mut();
        // SAFETY: `x` outlives the call; on success `out` is a new `at::Tensor*` we own.
        let err = unsafe {
            ffi::vlc_sp_all_to_all(self.raw(), ffi::tptr(x), scatter_dim, gather_dim, &mut out)
        };
        self.check("all_to_all", err)?;
        Ok(unsafe { ffi::take_tensor(out) })
    }

    /// Expert parallelism's exchange, differentiable: the rows of `x` (dim 0) in blocks of
    /// `send[r]` rows, block r to rank r; the result joins the blocks received, `recv[r]`
    /// rows from rank r, in rank order (every rank's `send` must match its peers' `recv`).
    /// Its gradient is the exchange back. The group must outlive the autograd graph.
    pub fn all_to_all_rows(&self, x: &Tensor, send: &[i64], recv: &[i64]) -> Result<Tensor> {
        if send.len() != self.size() || recv.len() != self.size() {
            return Err(DistError::Invalid(format!(
                "all_to_all: {} send and {} receive blocks for {} ranks",
                send.len(),
                recv.len(),
                self.size()
            )));
        }
        let mut out: ffi::TensorPtr = std::ptr::null_mut();
        // SAFETY: `x` and both slices outlive the call; on success `out` is a new `at::Tensor*`
        // we own.
        let err = unsafe {
            ffi::vlc_ep_all_to_all(
                self.raw(),
                ffi::tptr(x),
                send.as_ptr(),
                recv.as_ptr(),
                send.len() as i64,
                &mut out,
            )
        };
        self.check("all_to_all", err)?;
        Ok(unsafe { ffi::take_tensor(out) })
    }

    /// Every rank's `x` joined along `dim` in rank order, differentiable for a function every
    /// rank computes alike from the result: the gradient is this rank's slice of the incoming
    /// one. Every rank's `x` must have the same shape.
    pub fn gather_same_differentiable(&self, x: &Tensor, dim: i64) -> Result<Tensor> {
        let mut out: ffi::TensorPtr = std::ptr::null_mut();
        // SAFETY: as in `all_to_all_differentiable`.
        let err = unsafe { ffi::vlc_sp_gather_same(self.raw(), ffi::tptr(x), dim, &mut out) };
        self.check("all_gather", err)?;
        Ok(unsafe { ffi::take_tensor(out) })
    }

    /// 1-D views of a contiguous output and input (c10d wants flat buffers).
    fn flat_pair(
        &self,
        op: &'static str,
        output: &Tensor,
        input: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let bad = |what: &str| DistError::Invalid(format!("{op}: {what} must be contiguous"));
        if !output.is_contiguous() {
            return Err(bad("output"));
        }
        if !input.is_contiguous() {
            return Err(bad("input"));
        }
        let view = |t: &Tensor| {
            t.f_view([-1])
                .map_err(|e| DistError::Invalid(format!("{op}: {e}")))
        };
        Ok((view(output)?, view(input)?))
    }

    /// `text` of group rank `root` on every rank (`text` is read on the root only): its
    /// length, then its bytes.
    pub fn broadcast_text(&self, text: &str, root: usize) -> Result<String> {
        let bad = |e: tch::TchError| DistError::Invalid(format!("broadcast_text: {e}"));
        let mine = self.rank() == root;
        let len = Tensor::from_slice(&[if mine { text.len() as i64 } else { 0 }]);
        self.broadcast(&len, root)?;
        let n = len.f_int64_value(&[0]).map_err(bad)?;
        let bytes = if mine {
            Tensor::from_slice(text.as_bytes())
        } else {
            Tensor::zeros([n], (tch::Kind::Uint8, tch::Device::Cpu))
        };
        self.broadcast(&bytes, root)?;
        let v = Vec::<u8>::try_from(&bytes).map_err(bad)?;
        String::from_utf8(v).map_err(|e| DistError::Invalid(format!("broadcast_text: {e}")))
    }

    /// Copies `t` from group rank `root` into `t` on every other rank.
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        self.broadcast_many(std::slice::from_ref(t), root)
    }

    /// Broadcasts several tensors (one collective per dtype and device).
    pub fn broadcast_many(&self, ts: &[Tensor], root: usize) -> Result<()> {
        let root = self.group_rank_arg("broadcast root", root)?;
        self.coalesced("broadcast", ts, |pg, flat| {
            let ptr = ffi::tptr(flat);
            // SAFETY: `flat` outlives the call.
            let err = unsafe { ffi::vlc_pg_broadcast(pg.raw(), &ptr, 1, root, 0) };
            pg.check("broadcast", err)
        })
    }

    /// Sends `t` to group rank `dst` (blocks until the transfer completes).
    pub fn send(&self, t: &Tensor, dst: usize, tag: u32) -> Result<()> {
        let dst = self.group_rank_arg("send destination", dst)?;
        let tag = to_i32(tag as usize)?;
        // SAFETY: tensor outlives the call.
        let err = unsafe { ffi::vlc_pg_send(self.raw(), ffi::tptr(t), dst, tag, 0) };
        self.check("send", err)
    }

    /// Receives into `t` from group rank `src`.
    pub fn recv(&self, t: &Tensor, src: usize, tag: u32) -> Result<()> {
        let src = self.group_rank_arg("recv source", src)?;
        let tag = to_i32(tag as usize)?;
        // SAFETY: tensor outlives the call.
        let err = unsafe { ffi::vlc_pg_recv(self.raw(), ffi::tptr(t), src, tag, 0) };
        self.check("recv", err)
    }

    pub fn barrier(&self) -> Result<()> {
        // SAFETY: live group.
        let err = unsafe { ffi::vlc_pg_barrier(self.raw(), 0) };
        self.check("barrier", err)
    }

    /// A sub-group of the given ranks of this group (`torch.distributed.new_group`).
    ///
    /// Every member of `self` must call this, in the same order relative to other sub-group
    /// creations, with the same `ranks`; members get `Some`, the others `None`. The new group's
    /// rank order follows `ranks`.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<ProcessGroup>> {
        self.split(std::slice::from_ref(&ranks.to_vec()))
    }

    /// Creates one sub-group per rank list (e.g. all DP groups of a layout) and returns the
    /// one this rank belongs to. Collective over `self`, like [`new_group`](Self::new_group);
    /// the lists must be disjoint.
    pub fn split(&self, partition: &[Vec<usize>]) -> Result<Option<ProcessGroup>> {
        let mut seen = vec![false; self.size()];
        for ranks in partition {
            if ranks.is_empty() {
                return Err(DistError::Invalid("empty rank list in a sub-group".into()));
            }
            for &r in ranks {
                if r >= self.size() {
                    return Err(DistError::Invalid(format!(
                        "rank {r} is not in {} (size {})",
                        self.inner.name,
                        self.size()
                    )));
                }
                if std::mem::replace(&mut seen[r], true) {
                    return Err(DistError::Invalid(format!(
                        "rank {r} appears twice in the sub-group lists"
                    )));
                }
            }
        }
        let mut mine = None;
        for ranks in partition {
            let id = self.inner.next_subgroup.fetch_add(1, Ordering::SeqCst);
            let Some(pos) = ranks.iter().position(|&r| r == self.inner.rank) else {
                continue;
            };
            let global: Vec<usize> = ranks.iter().map(|&r| self.inner.global_ranks[r]).collect();
            let name = format!("{}.{}", self.inner.name, id);
            mine = Some(Self::create(
                self.inner.root_store.clone(),
                name,
                pos,
                global,
                self.inner.backend,
                self.inner.device,
                self.inner.timeout,
                self.inner.gloo_device.clone(),
            )?);
        }
        Ok(mine)
    }
}

fn to_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| DistError::Invalid(format!("{v} does not fit in i32")))
}

/// The model's layers reach their ranks through this (they name no process group).
impl crate::model::rank_group::RankGroup for ProcessGroup {
    fn rank(&self) -> usize {
        ProcessGroup::rank(self)
    }

    fn size(&self) -> usize {
        ProcessGroup::size(self)
    }

    fn sum_in_place(&self, t: &Tensor) -> Result<(), CollectiveError> {
        Ok(self.all_reduce(t, ReduceOp::Sum)?)
    }

    fn all_gather_into(&self, output: &Tensor, input: &Tensor) -> Result<(), CollectiveError> {
        Ok(ProcessGroup::all_gather_into(self, output, input)?)
    }

    fn all_to_all_rows(
        &self,
        x: &Tensor,
        send: &[i64],
        recv: &[i64],
    ) -> Result<Tensor, CollectiveError> {
        Ok(ProcessGroup::all_to_all_rows(self, x, send, recv)?)
    }
}

impl From<DistError> for CollectiveError {
    fn from(e: DistError) -> Self {
        CollectiveError(e.to_string())
    }
}
