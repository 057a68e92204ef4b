//! Raw declarations of the shim's C ABI: one header per concern in `csrc/` (`errors.h`,
//! `store.h`, `process_group.h`, `collectives.h`, `storage.h`, `optimizer.h`, `autograd.h`,
//! `kernel_calls.h`, `gloo_pacing.h`), which `build.rs` checks these declarations against
//! (`build_support/ffi_check.rs`). Safe wrappers live in `dist` and `ops`; no other module
//! calls these.
//!
//! Every `*mut c_char` return is NULL on success or a malloc'd error message that
//! [`take_error`] turns into a `String` and frees.
#![allow(non_camel_case_types)]

use std::ffi::{CStr, c_char, c_int, c_void};

#[repr(C)]
pub struct vlc_store {
    _private: [u8; 0],
}

#[repr(C)]
pub struct vlc_pg {
    _private: [u8; 0],
}

pub type TensorPtr = *mut c_void;

unsafe extern "C" {
    pub fn vlc_free_error(e: *mut c_char);

    pub fn vlc_tcpstore_new(
        host: *const c_char,
        port: u16,
        world_size: c_int,
        is_server: c_int,
        timeout_ms: i64,
        out: *mut *mut vlc_store,
    ) -> *mut c_char;
    pub fn vlc_prefixstore_new(
        prefix: *const c_char,
        base: *const vlc_store,
        out: *mut *mut vlc_store,
    ) -> *mut c_char;
    pub fn vlc_store_free(s: *mut vlc_store);
    pub fn vlc_store_set(
        s: *mut vlc_store,
        key: *const c_char,
        data: *const u8,
        len: usize,
    ) -> *mut c_char;
    pub fn vlc_store_get(
        s: *mut vlc_store,
        key: *const c_char,
        data: *mut *mut u8,
        len: *mut usize,
    ) -> *mut c_char;
    pub fn vlc_free_bytes(p: *mut u8);
    pub fn vlc_store_add(
        s: *mut vlc_store,
        key: *const c_char,
        value: i64,
        out: *mut i64,
    ) -> *mut c_char;
    pub fn vlc_store_set_timeout(s: *mut vlc_store, timeout_ms: i64) -> *mut c_char;

    pub fn vlc_pg_gloo_new(
        store: *const vlc_store,
        rank: c_int,
        size: c_int,
        timeout_ms: i64,
        iface: *const c_char,
        hostname: *const c_char,
        threads: c_int,
        out: *mut *mut vlc_pg,
    ) -> *mut c_char;
    pub fn vlc_has_nccl() -> c_int;
    pub fn vlc_gloo_pacing_stats(waits: *mut u64, yields: *mut u64);
    pub fn vlc_pg_nccl_new(
        store: *const vlc_store,
        rank: c_int,
        size: c_int,
        timeout_ms: i64,
        out: *mut *mut vlc_pg,
    ) -> *mut c_char;
    pub fn vlc_pg_free(pg: *mut vlc_pg);
    pub fn vlc_pg_allreduce(
        pg: *mut vlc_pg,
        tensors: *const TensorPtr,
        n: usize,
        op: c_int,
        timeout_ms: i64,
    ) -> *mut c_char;
    pub fn vlc_pg_allgather_into(
        pg: *mut vlc_pg,
        output: TensorPtr,
        input: TensorPtr,
        timeout_ms: i64,
    ) -> *mut c_char;
    pub fn vlc_pg_reduce_scatter(
        pg: *mut vlc_pg,
        output: TensorPtr,
        input: TensorPtr,
        op: c_int,
        timeout_ms: i64,
    ) -> *mut c_char;
    pub fn vlc_sp_all_to_all(
        pg: *mut vlc_pg,
        x: TensorPtr,
        scatter_dim: i64,
        gather_dim: i64,
        out: *mut TensorPtr,
    ) -> *mut c_char;
    pub fn vlc_ep_all_to_all(
        pg: *mut vlc_pg,
        x: TensorPtr,
        send: *const i64,
        recv: *const i64,
        n: i64,
        out: *mut TensorPtr,
    ) -> *mut c_char;
    pub fn vlc_sp_gather_same(
        pg: *mut vlc_pg,
        x: TensorPtr,
        dim: i64,
        out: *mut TensorPtr,
    ) -> *mut c_char;
    pub fn vlc_pg_broadcast(
        pg: *mut vlc_pg,
        tensors: *const TensorPtr,
        n: usize,
        root: c_int,
        timeout_ms: i64,
    ) -> *mut c_char;
    pub fn vlc_pg_send(
        pg: *mut vlc_pg,
        t: TensorPtr,
        dst: c_int,
        tag: c_int,
        timeout_ms: i64,
    ) -> *mut c_char;
    pub fn vlc_pg_recv(
        pg: *mut vlc_pg,
        t: TensorPtr,
        src: c_int,
        tag: c_int,
        timeout_ms: i64,
    ) -> *mut c_char;
    pub fn vlc_pg_barrier(pg: *mut vlc_pg, timeout_ms: i64) -> *mut c_char;

    pub fn vlc_fused_adamw(
        params: *const TensorPtr,
        grads: *const TensorPtr,
        exp_avgs: *const TensorPtr,
        exp_avg_sqs: *const TensorPtr,
        state_steps: *const TensorPtr,
        n: usize,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        maximize: c_int,
        grad_scale: TensorPtr,
        found_inf: TensorPtr,
    ) -> *mut c_char;
    pub fn vlc_storage_free(t: TensorPtr) -> *mut c_char;
    pub fn vlc_storage_alloc(t: TensorPtr, nbytes: usize) -> *mut c_char;
    pub fn vlc_storage_nbytes(t: TensorPtr) -> usize;
    pub fn vlc_fused_sgd(
        params: *const TensorPtr,
        grads: *const TensorPtr,
        momentum_bufs: *const TensorPtr,
        n: usize,
        weight_decay: f64,
        momentum: f64,
        lr: f64,
        dampening: f64,
        nesterov: c_int,
        maximize: c_int,
        is_first_step: c_int,
        grad_scale: TensorPtr,
        found_inf: TensorPtr,
    ) -> *mut c_char;
    pub fn vlc_foreach_non_finite_check_and_unscale(
        grads: *const TensorPtr,
        n: usize,
        found_inf: TensorPtr,
        inv_scale: TensorPtr,
    ) -> *mut c_char;
    pub fn vlc_foreach_norm(
        tensors: *const TensorPtr,
        n: usize,
        ord: f64,
        out: *mut TensorPtr,
    ) -> *mut c_char;
    pub fn vlc_foreach_copy(
        dst: *const TensorPtr,
        src: *const TensorPtr,
        n: usize,
        non_blocking: c_int,
    ) -> *mut c_char;
    pub fn vlc_foreach_adamw(
        params: *const TensorPtr,
        grads: *const TensorPtr,
        exp_avgs: *const TensorPtr,
        exp_avg_sqs: *const TensorPtr,
        steps: *const f64,
        n: usize,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
    ) -> *mut c_char;
    pub fn vlc_foreach_mul_scalar(tensors: *const TensorPtr, n: usize, s: f64) -> *mut c_char;
    pub fn vlc_foreach_mul_tensor(
        tensors: *const TensorPtr,
        n: usize,
        scalar: TensorPtr,
    ) -> *mut c_char;
    pub fn vlc_tensor_set_grad(tensor: TensorPtr, grad: TensorPtr) -> *mut c_char;
    pub fn vlc_have_cpu_kernels() -> c_int;
    #[allow(clippy::too_many_arguments)]
    pub fn vlc_chunk_gated_delta_rule(
        q: TensorPtr,
        k: TensorPtr,
        v: TensorPtr,
        g: TensorPtr,
        beta: TensorPtr,
        initial: TensorPtr,
        chunk: i64,
        scale: f64,
        out: *mut TensorPtr,
        last: *mut TensorPtr,
    ) -> *mut c_char;
    pub fn vlc_causal_conv(x: TensorPtr, w: TensorPtr, out: *mut TensorPtr) -> *mut c_char;
    pub fn vlc_gated_rms_norm(
        x: TensorPtr,
        s: TensorPtr,
        w: TensorPtr,
        eps: f64,
        out_bf16: c_int,
        out: *mut TensorPtr,
    ) -> *mut c_char;
    pub fn vlc_autograd_backward(
        tensors: *const TensorPtr,
        grads: *const TensorPtr,
        n: usize,
        keep_graph: c_int,
    ) -> *mut c_char;
}

/// Converts a shim return value into `Err(message)` (freeing the C string) or `Ok(())`.
pub fn take_error(e: *mut c_char) -> Result<(), String> {
    if e.is_null() {
        return Ok(());
    }
    // SAFETY: non-null returns are NUL-terminated strings malloc'd by the shim, freed once here.
    let msg = unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned();
    unsafe { vlc_free_error(e) };
    Err(msg)
}

/// Borrowed `at::Tensor*` of a tch tensor, for the duration of one shim call.
pub fn tptr(t: &tch::Tensor) -> TensorPtr {
    t.as_ptr() as TensorPtr
}

/// Takes ownership of an `at::Tensor*` the shim returned.
///
/// # Safety
/// `p` is a tensor the shim just created (an `out` argument after a successful call), owned
/// by nobody else.
pub unsafe fn take_tensor(p: TensorPtr) -> tch::Tensor {
    // SAFETY: per this function's contract.
    unsafe { tch::Tensor::from_ptr(p as *mut torch_sys::C_tensor) }
}

/// Pointers of a list of tensors, borrowed for one shim call.
pub fn tptrs<'a, I: IntoIterator<Item = &'a tch::Tensor>>(ts: I) -> Vec<TensorPtr> {
    ts.into_iter().map(tptr).collect()
}

#[cfg(test)]
#[path = "../build_support/ffi_check.rs"]
mod ffi_check;
