// CPU kernels the runtime defines itself (beside the bindings of shim.cpp), each a
// differentiable torch operation.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

// The kernels' loops are compiled twice, for the baseline x86-64 and for AVX2 with FMA
// (Haswell's set), and the processor picks at load time: the build stays portable (a trainer
// may run on another machine than the one that built it) and AVX2 machines run the wide loops.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define VLC_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define VLC_VECTOR_CLONES
#endif

namespace vlc_kernels {

// sum_i a[i] b[i] in eight independent partial sums: without -ffast-math the compiler keeps
// a single sum in order, one dependent add per element; eight lanes vectorise (and pipeline).
inline float dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += a[i + j] * b[i + j];
  }
  float s = 0.f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 8; ++j) s += lane[j];
  return s;
}

// The number of parts `parallel_parts` splits `n` items into: libtorch's thread count, at
// most one part per `grain` items.
inline int64_t part_count(int64_t n, int64_t grain) {
  return std::min<int64_t>(std::max(at::get_num_threads(), 1), std::max<int64_t>(n / grain, 1));
}

// `f(begin, end, part)` over [0, n) split evenly into `part_count(n, grain)` parts, on
// libtorch's OpenMP threads (these files are compiled with -fopenmp and link the libgomp that
// libtorch loads, through tch's `-lgomp`). Not threads of our own: libtorch's idle OpenMP
// workers spin for a while after each operation, and threads beside them would share the
// cores with that spinning (measured: the delta rule 58 ms on the team, 74 on std::threads).
template <typename F>
void parallel_parts(int64_t n, int64_t grain, const F& f) {
  const int64_t parts = part_count(n, grain);
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t i = p0; i < p1; ++i) f(n * i / parts, n * (i + 1) / parts, i);
  });
}

// `f(begin, end)` over [0, n) as `parallel_parts` splits it.
template <typename F>
void parallel_ranges(int64_t n, int64_t grain, const F& f) {
  parallel_parts(n, grain, [&f](int64_t begin, int64_t end, int64_t) { f(begin, end); });
}

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

// The Gated DeltaNet's gated output norm: `w * x / sqrt(mean(x^2) + eps) * s` per row of the
// last dimension, `x` and `s` (the gate's SiLU) f32 of one shape, `w` `(d,)`; the output in
// `out` (f32 or bf16). Differentiable in `x`, `s` and `w`.
at::Tensor gated_rms_norm(const at::Tensor& x, const at::Tensor& s, const at::Tensor& w,
                          double eps, at::ScalarType out);

}  // namespace vlc_kernels
