// kernel_calls.h: the C ABI of the CPU kernels of kernels.h.
#include "boundary.h"
#include "kernel_calls.h"
#include "kernels.h"

using namespace vlc;

extern "C" {

// Whether the CPU kernels of kernels.h can run in this process (1) or not (0).
int vlc_have_cpu_kernels(void) {
  return vlc_kernels::have_blas() ? 1 : 0;
}

// The chunked gated delta rule (kernels.h); `*out` and `*last` receive new tensors the caller
// owns.
char* vlc_chunk_gated_delta_rule(void* q, void* k, void* v, void* g, void* beta, void* initial,
                                 int64_t chunk, double scale, void** out, void** last) {
  return guarded([&] {
    auto r = vlc_kernels::chunk_gated_delta_rule(T(q), T(k), T(v), T(g), T(beta), T(initial),
                                                 chunk, scale);
    *out = new at::Tensor(r[0]);
    *last = new at::Tensor(r[1]);
  });
}

// The causal depthwise convolution (kernels.h); `*out` as above.
char* vlc_causal_conv(void* x, void* w, void** out) {
  return guarded([&] { *out = new at::Tensor(vlc_kernels::causal_conv(T(x), T(w))); });
}

// The gated output norm (kernels.h); `out_bf16` picks a bf16 output over f32; `*out` as above.
char* vlc_gated_rms_norm(void* x, void* s, void* w, double eps, int out_bf16, void** out) {
  return guarded([&] {
    *out = new at::Tensor(vlc_kernels::gated_rms_norm(
        T(x), T(s), T(w), eps, out_bf16 != 0 ? at::kBFloat16 : at::kFloat));
  });
}

}  // extern "C"
