//! Safe wrappers over the fused and foreach kernels that tch does not bind, the runtime's own
//! CPU kernels (`csrc/kernels.h`), and [`tensor_bytes`], the one measure of a tensor's memory
//! the memory reports use.
use tch::Tensor;

use crate::ffi;

#[derive(Debug, thiserror::Error)]
#[error("{op}: {message}")]
pub struct OpError {
    pub op: &'static str,
    pub message: String,
}

pub type Result<T, E = OpError> = std::result::Result<T, E>;

fn check(op: &'static str, err: *mut std::ffi::c_char) -> Result<()> {
    ffi::take_error(err).map_err(|message| OpError { op, message })
}

fn same_len(op: &'static str, lens: &[usize]) -> Result<()> {
    if lens.windows(2).any(|w| w[0] != w[1]) {
        return Err(OpError {
            op,
            message: format!("tensor lists differ in length: {lens:?}"),
        });
    }
    Ok(())
}

/// The pointer lists of an Adam step's params, grads and two moments, after checking that
/// they (and `steps` step counters) have one entry per param; `None` when there are none.
fn adam_ptrs(
    op: &'static str,
    lists: [&[Tensor]; 4],
    steps: usize,
) -> Result<Option<[Vec<ffi::TensorPtr>; 4]>> {
    let [params, grads, exp_avgs, exp_avg_sqs] = lists;
    same_len(
        op,
        &[
            params.len(),
            grads.len(),
            exp_avgs.len(),
            exp_avg_sqs.len(),
            steps,
        ],
    )?;
    Ok((!params.is_empty()).then(|| lists.map(ffi::tptrs)))
}

fn opt_ptr(t: Option<&Tensor>) -> ffi::TensorPtr {
    t.map_or(std::ptr::null_mut(), ffi::tptr)
}

/// Hyper-parameters of one `_fused_adamw_` call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWArgs {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
    pub maximize: bool,
}

/// Whether the runtime's CPU kernels can run here (they call the BLAS libtorch links).
///
/// `VERLC_CPU_KERNELS=0` turns them off: the Gated DeltaNet then runs its tensor-op form, the
/// reference the kernels are tested against (for telling a kernel's numerics from a model's).
pub fn have_cpu_kernels() -> bool {
    static HAVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAVE.get_or_init(|| {
        let off = std::env::var("VERLC_CPU_KERNELS").is_ok_and(|v| v == "0");
        // SAFETY: no arguments; reads whether a symbol resolved.
        !off && unsafe { ffi::vlc_have_cpu_kernels() } != 0
    })
}

/// The chunked gated delta rule as one differentiable CPU operation (`csrc/kernels.h`): `q`,
/// `k` `(B, T, H_k, d_k)` and `v` `(B, T, H_v, d_v)` with contiguous rows, log decays `g`
/// and `beta` `(B, T, H_v)`, `initial` `(B, H_v, d_k, d_v)` contiguous, all f32; value head
/// h reads key head `h / (H_v / H_k)`; queries and keys are L2-normalised inside, queries
/// then scaled by `scale`. Returns `(out (B, T, H_v, d_v), final state)`.
pub fn chunk_gated_delta_rule(
    [q, k, v, g, beta]: [&Tensor; 5],
    initial: &Tensor,
    chunk: i64,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let (mut out, mut last): (ffi::TensorPtr, ffi::TensorPtr) =
        (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: every tensor outlives the call; on success both outputs are new `at::Tensor*`
    // we own.
    let err = unsafe {
        ffi::vlc_chunk_gated_delta_rule(
            ffi::tptr(q),
            ffi::tptr(k),
            ffi::tptr(v),
            ffi::tptr(g),
            ffi::tptr(beta),
            ffi::tptr(initial),
            chunk,
            scale,
            &mut out,
            &mut last,
        )
    };
    check("chunk_gated_delta_rule", err)?;
    // SAFETY: both pointers were just created by the shim and are owned by nobody else.
    Ok(unsafe { (ffi::take_tensor(out), ffi::take_tensor(last)) })
}

/// The short causal depthwise convolution as one differentiable CPU operation
/// (`csrc/kernels.h`): `x` `(B, T, C)` f32 or bf16, taps `w` `(C, kernel)`; returns
/// `y[b, t, c] = sum_j w[c, j] x[b, t - (kernel - 1) + j, c]` (zeros before the start) in f32.
pub fn causal_conv(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let mut out: ffi::TensorPtr = std::ptr::null_mut();
    // SAFETY: both tensors outlive the call; on success `out` is a new `at::Tensor*` we own.
    let err = unsafe { ffi::vlc_causal_conv(ffi::tptr(x), ffi::tptr(w), &mut out) };
    check("causal_conv", err)?;
    // SAFETY: just created by the shim, owned by nobody else.
    Ok(unsafe { ffi::take_tensor(out) })
}

/// The Gated DeltaNet's gated output norm as one differentiable CPU operation
/// (`csrc/kernels.h`): `w * x / sqrt(mean(x^2) + eps) * s` over the last dimension, `x` and
/// `s` f32 of one shape, `w` `(d,)`; the result in bf16 when `bf16_out`, else f32.
pub fn gated_rms_norm(
    x: &Tensor,
    s: &Tensor,
    w: &Tensor,
    eps: f64,
    bf16_out: bool,
) -> Result<Tensor> {
    let mut out: ffi::TensorPtr = std::ptr::null_mut();
    // SAFETY: the tensors outlive the call; on success `out` is a new `at::Tensor*` we own.
    let err = unsafe {
        ffi::vlc_gated_rms_norm(
            ffi::tptr(x),
            ffi::tptr(s),
            ffi::tptr(w),
            eps,
            bf16_out as i32,
            &mut out,
        )
    };
    check("gated_rms_norm", err)?;
    // SAFETY: just created by the shim, owned by nobody else.
    Ok(unsafe { ffi::take_tensor(out) })
}

/// `torch._fused_adamw_`: decoupled-weight-decay Adam over lists on one device and dtype.
/// `steps` are fp32 scalars already incremented for this step (torch increments them first).
/// With `found_inf` (a 1-element fp32 tensor) set to non-zero the kernel leaves everything
/// untouched; `grad_scale` divides the grads first.
#[allow(clippy::too_many_arguments)] // mirrors the kernel's signature
pub fn fused_adamw(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    steps: &[Tensor],
    args: AdamWArgs,
    grad_scale: Option<&Tensor>,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    let lists = [params, grads, exp_avgs, exp_avg_sqs];
    let Some([p, g, m, v]) = adam_ptrs("fused_adamw", lists, steps.len())? else {
        return Ok(());
    };
    let s = ffi::tptrs(steps);
    // SAFETY: every tensor outlives the call; lists have equal length.
    let err = unsafe {
        ffi::vlc_fused_adamw(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            s.as_ptr(),
            p.len(),
            args.lr,
            args.beta1,
            args.beta2,
            args.weight_decay,
            args.eps,
            args.maximize as i32,
            opt_ptr(grad_scale),
            opt_ptr(found_inf),
        )
    };
    check("fused_adamw", err)
}

/// Hyper-parameters of one `_fused_sgd_` call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdArgs {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub maximize: bool,
}

/// `torch._fused_sgd_`. With momentum, `is_first_step` makes the buffers start as the grads
/// (torch's `momentum_buffer is None` case); `momentum_bufs` may be empty without momentum.
pub fn fused_sgd(
    params: &[Tensor],
    grads: &[Tensor],
    momentum_bufs: &[Tensor],
    args: SgdArgs,
    is_first_step: bool,
) -> Result<()> {
    same_len("fused_sgd", &[params.len(), grads.len()])?;
    if args.momentum != 0.0 {
        same_len("fused_sgd", &[params.len(), momentum_bufs.len()])?;
    }
    if params.is_empty() {
        return Ok(());
    }
    let (p, g, b) = (
        ffi::tptrs(params),
        ffi::tptrs(grads),
        ffi::tptrs(momentum_bufs),
    );
    // SAFETY: every tensor outlives the call; lists checked above.
    let err = unsafe {
        ffi::vlc_fused_sgd(
            p.as_ptr(),
            g.as_ptr(),
            b.as_ptr(),
            p.len(),
            args.weight_decay,
            args.momentum,
            args.lr,
            args.dampening,
            args.nesterov as i32,
            args.maximize as i32,
            is_first_step as i32,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    check("fused_sgd", err)
}

/// `torch._amp_foreach_non_finite_check_and_unscale_`: `g *= inv_scale` for every grad and
/// `found_inf := 1` if any element is inf/nan. Both scalars live on the grads' device.
pub fn non_finite_check_and_unscale(
    grads: &[Tensor],
    found_inf: &Tensor,
    inv_scale: &Tensor,
) -> Result<()> {
    if grads.is_empty() {
        return Ok(());
    }
    let g = ffi::tptrs(grads);
    // SAFETY: tensors outlive the call.
    let err = unsafe {
        ffi::vlc_foreach_non_finite_check_and_unscale(
            g.as_ptr(),
            g.len(),
            ffi::tptr(found_inf),
            ffi::tptr(inv_scale),
        )
    };
    check("non_finite_check_and_unscale", err)
}

/// torch.optim.AdamW's default (foreach) step over lists on one device: the ops of
/// `_multi_tensor_adam` one after another, each rounding to the tensors' dtype (for bf16
/// params and state, what torch computes for a bf16 model; `fused_adamw` rounds once).
/// `steps` are the step counts after this step's increment. `maximize` is refused.
pub fn foreach_adamw(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    steps: &[f64],
    args: AdamWArgs,
) -> Result<()> {
    if args.maximize {
        return Err(OpError {
            op: "foreach_adamw",
            message: "maximize is not supported".into(),
        });
    }
    let lists = [params, grads, exp_avgs, exp_avg_sqs];
    let Some([p, g, m, v]) = adam_ptrs("foreach_adamw", lists, steps.len())? else {
        return Ok(());
    };
    // SAFETY: every tensor and `steps` outlive the call; lists have equal length.
    let err = unsafe {
        ffi::vlc_foreach_adamw(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            steps.as_ptr(),
            p.len(),
            args.lr,
            args.beta1,
            args.beta2,
            args.weight_decay,
            args.eps,
        )
    };
    check("foreach_adamw", err)
}

/// `torch._foreach_norm(ts, ord, dtype=float32)`: one fp32 scalar per tensor.
pub fn foreach_norm(ts: &[Tensor], ord: f64) -> Result<Vec<Tensor>> {
    if ts.is_empty() {
        return Ok(Vec::new());
    }
    let p = ffi::tptrs(ts);
    let mut out = vec![std::ptr::null_mut(); p.len()];
    // SAFETY: inputs outlive the call; on success out[i] are fresh heap tensors we now own.
    let err = unsafe { ffi::vlc_foreach_norm(p.as_ptr(), p.len(), ord, out.as_mut_ptr()) };
    check("foreach_norm", err)?;
    // SAFETY: each pointer is a `new at::Tensor` handed over to tch, which frees it on drop.
    Ok(out
        .into_iter()
        .map(|t| unsafe { ffi::take_tensor(t) })
        .collect())
}

/// `torch._foreach_copy_(dst, src)`: per-pair copy with dtype/device conversion.
pub fn foreach_copy(dst: &[Tensor], src: &[Tensor], non_blocking: bool) -> Result<()> {
    same_len("foreach_copy", &[dst.len(), src.len()])?;
    if dst.is_empty() {
        return Ok(());
    }
    let (d, s) = (ffi::tptrs(dst), ffi::tptrs(src));
    // SAFETY: tensors outlive the call.
    let err =
        unsafe { ffi::vlc_foreach_copy(d.as_ptr(), s.as_ptr(), d.len(), non_blocking as i32) };
    check("foreach_copy", err)
}

/// `torch._foreach_mul_(ts, s)`.
pub fn foreach_mul_scalar(ts: &[Tensor], s: f64) -> Result<()> {
    if ts.is_empty() {
        return Ok(());
    }
    let p = ffi::tptrs(ts);
    // SAFETY: tensors outlive the call.
    let err = unsafe { ffi::vlc_foreach_mul_scalar(p.as_ptr(), p.len(), s) };
    check("foreach_mul", err)
}

/// `torch._foreach_mul_(ts, scalar_tensor)` (no host sync on CUDA).
pub fn foreach_mul_tensor(ts: &[Tensor], scalar: &Tensor) -> Result<()> {
    if ts.is_empty() {
        return Ok(());
    }
    let p = ffi::tptrs(ts);
    // SAFETY: tensors outlive the call.
    let err = unsafe { ffi::vlc_foreach_mul_tensor(p.as_ptr(), p.len(), ffi::tptr(scalar)) };
    check("foreach_mul", err)
}

/// Sets `t.grad` (`None` releases it, like `set_to_none=True`).
pub fn set_grad(t: &Tensor, grad: Option<&Tensor>) -> Result<()> {
    // SAFETY: tensors outlive the call; the shim stores a new reference to `grad`.
    let err = unsafe { ffi::vlc_tensor_set_grad(ffi::tptr(t), opt_ptr(grad)) };
    check("set_grad", err)
}

/// `torch.autograd.backward(roots, grads)`: back-propagates from every root with its incoming
/// gradient in one pass, accumulating into the leaves' `.grad`. `keep_graph` keeps the graph
/// for another pass.
pub fn backward(roots: &[Tensor], grads: &[Tensor], keep_graph: bool) -> Result<()> {
    same_len("backward", &[roots.len(), grads.len()])?;
    let r = ffi::tptrs(roots);
    let g = ffi::tptrs(grads);
    // SAFETY: tensors outlive the call; the shim only borrows them.
    let err =
        unsafe { ffi::vlc_autograd_backward(r.as_ptr(), g.as_ptr(), r.len(), keep_graph as i32) };
    check("backward", err)
}

/// Bytes of `t`'s elements (0 for an undefined tensor): what it holds, however its storage is
/// placed (see [`storage_bytes`] for the storage itself).
pub fn tensor_bytes(t: &Tensor) -> i64 {
    if t.defined() {
        t.numel() as i64 * t.kind().elt_size_in_bytes() as i64
    } else {
        0
    }
}

/// Bytes of `t`'s storage now (0 for an undefined tensor, or one whose storage was freed).
pub fn storage_bytes(t: &Tensor) -> usize {
    if !t.defined() {
        return 0;
    }
    // SAFETY: the tensor outlives the call; the shim only reads the storage size.
    unsafe { ffi::vlc_storage_nbytes(ffi::tptr(t)) }
}

/// Releases the memory of `t`'s storage (torch's `untyped_storage().resize_(0)`): every view
/// of it keeps its handle and has no data until [`alloc_storage`] gives it memory again.
pub fn free_storage(t: &Tensor) -> Result<()> {
    // SAFETY: `t` outlives the call; the shim resizes its storage to zero bytes.
    check("free_storage", unsafe {
        ffi::vlc_storage_free(ffi::tptr(t))
    })
}

/// Gives `t`'s storage `nbytes` of fresh, uninitialised memory (after [`free_storage`]).
pub fn alloc_storage(t: &Tensor, nbytes: usize) -> Result<()> {
    // SAFETY: `t` outlives the call; the shim resizes its storage to `nbytes`.
    check("alloc_storage", unsafe {
        ffi::vlc_storage_alloc(ffi::tptr(t), nbytes)
    })
}
