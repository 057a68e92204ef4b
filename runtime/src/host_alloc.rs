//! Host memory reuse for training processes.
//!
//! A training step frees and allocates the same large host tensors every time (gradients,
//! activations, logits). glibc serves every block over 32 MiB with its own `mmap` and returns
//! it to the kernel on free, so each step faults every page of those tensors in again and the
//! kernel zeroes them: on a 2-core AMD EPYC a 2-layer Qwen2.5-0.5B-shaped actor update took
//! 3.8 s that way and 2.8 s with freed memory kept in the process (bench/train_step), at the
//! cost of a higher peak (+23% RSS there). PyTorch users get the same effect from jemalloc or
//! tcmalloc; a binary cannot preload those, so it tells glibc to keep what it frees.
//!
//! `VERLC_HOST_ALLOC=system` keeps glibc's defaults (for a host short of memory).

/// Keep freed host memory in the process (no `mmap` per large block, no trimming). Call once
/// at start-up, before the large allocations; other C libraries than glibc are left alone.
pub fn keep_freed_memory() {
    if std::env::var_os("VERLC_HOST_ALLOC").is_some_and(|v| v == "system") {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocation parameters; it is safe to call at any
    // time, from any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        // -1: never give the top of the heap back.
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
    }
}
