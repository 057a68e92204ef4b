// CPU kernels the runtime defines itself (beside the bindings of shim.cpp), each a
// differentiable torch operation.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <thread>
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

// `f(begin, end)` over [0, n) split evenly across libtorch's thread count, at least `grain`
// items a part. Not at::parallel_for: with an OpenMP libtorch that template expands to
// `#pragma omp parallel` in the caller, and these files are compiled without OpenMP (a second
// runtime beside torch's), so it would run serially.
template <typename F>
void parallel_ranges(int64_t n, int64_t grain, const F& f) {
  const int64_t parts =
      std::min<int64_t>(std::max(at::get_num_threads(), 1), std::max<int64_t>(n / grain, 1));
  if (parts <= 1) {
    f(0, n);
    return;
  }
  std::vector<std::thread> team;
  team.reserve(parts - 1);
  for (int64_t i = 1; i < parts; ++i) {
    team.emplace_back([&f, i, parts, n] { f(n * i / parts, n * (i + 1) / parts); });
  }
  f(0, n / parts);
  for (auto& t : team) t.join();
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

}  // namespace vlc_kernels
