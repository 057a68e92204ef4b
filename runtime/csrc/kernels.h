// CPU kernels the runtime defines itself (beside the bindings of shim.cpp), each a
// differentiable torch operation.
#pragma once

#include <ATen/ATen.h>

#include <vector>

// The kernels' loops are compiled twice, for the baseline x86-64 and for AVX2 with FMA
// (Haswell's set), and the processor picks at load time: the build stays portable (a trainer
// may run on another machine than the one that built it) and AVX2 machines run the wide loops.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define VLC_VECTOR_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define VLC_VECTOR_CLONES
#endif

namespace vlc_kernels {

// Whether the kernels below can run: they call the BLAS that libtorch links (MKL's `sgemm_`);
// a libtorch without one leaves the caller to its tensor-op path.
bool have_blas();

// The chunked gated delta rule (see runtime/src/model/gated_deltanet.rs) in chunks of
// `chunk` tokens: `q`, `k` `(B, T, H_k, d_k)`, `v` `(B, T, H_v, d_v)` (each row contiguous,
// any other strides), `g` (log decays) and `beta` `(B, T, H_v)`, `initial`
// `(B, H_v, d_k, d_v)` contiguous, all f32 CPU. Value head h reads key head h / (H_v / H_k).
// Queries and keys are L2-normalised per row here, queries then scaled by `scale`. Returns
// `{out (B, T, H_v, d_v), final state}`, both differentiable in every input.
std::vector<at::Tensor> chunk_gated_delta_rule(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& g,
                                               const at::Tensor& beta, const at::Tensor& initial,
                                               int64_t chunk, double scale);

// The short causal depthwise convolution of `x` `(B, T, C)` (f32 or bf16) with taps `w`
// `(C, kernel)`: `y[b, t, c] = sum_j w[c, j] x[b, t - (kernel - 1) + j, c]` from zeros before
// the start, as f32 `(B, T, C)`; differentiable in both inputs.
at::Tensor causal_conv(const at::Tensor& x, const at::Tensor& w);

}  // namespace vlc_kernels
