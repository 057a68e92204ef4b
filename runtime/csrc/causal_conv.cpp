// The Gated DeltaNet's short causal depthwise convolution on CPU, forward and backward.
//
// As tensor ops (runtime/src/model/gated_deltanet.rs, `conv`) it is `kernel` shifted
// products over (B, T, C): each a full pass over the activations, forward and again twice in
// the backward (the input's and the taps' gradients), plus a zero-filled buffer per slice.
// Here each output reads its `kernel` inputs once; the input may be bf16 (read directly), the
// output is f32 (what the recurrence reads). Threads split the channels, so each owns its
// taps' gradient and none needs a reduction.
#include "kernels.h"

#include <c10/util/BFloat16.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

namespace vlc_kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename T>
inline float as_float(T x) {
  return static_cast<float>(x);
}

// y[b, t, c] = sum_j w[c, j] x[b, t - (K - 1) + j, c], x zero before t = 0.
template <typename T>
VLC_VECTOR_CLONES void conv_forward(const T* x, const float* w, float* y, int64_t B, int64_t L, int64_t C,
                  int64_t K, int64_t c0, int64_t c1) {
  std::vector<float> taps((c1 - c0) * K);
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t j = 0; j < K; ++j) taps[j * (c1 - c0) + (c - c0)] = w[c * K + j];
  }
  const int64_t n = c1 - c0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < L; ++t) {
      float* out = y + (b * L + t) * C + c0;
      std::fill(out, out + n, 0.f);
      for (int64_t j = 0; j < K; ++j) {
        const int64_t s = t - (K - 1) + j;
        if (s < 0) continue;
        const T* in = x + (b * L + s) * C + c0;
        const float* tap = &taps[j * n];
        for (int64_t c = 0; c < n; ++c) out[c] += tap[c] * as_float(in[c]);
      }
    }
  }
}

// dx[b, s, c] = sum_j w[c, j] dy[b, s + (K - 1) - j, c]; dw[c, j] = sum_{b,t} dy[b, t, c]
// x[b, t - (K - 1) + j, c].
template <typename T>
VLC_VECTOR_CLONES void conv_backward(const T* x, const float* w, const float* dy, T* dx, float* dw, int64_t B,
                   int64_t L, int64_t C, int64_t K, int64_t c0, int64_t c1) {
  const int64_t n = c1 - c0;
  std::vector<float> taps(n * K), dtaps(n * K, 0.f), acc(n);
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t j = 0; j < K; ++j) taps[j * n + (c - c0)] = w[c * K + j];
  }
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < L; ++s) {
      std::fill(acc.begin(), acc.end(), 0.f);
      const T* in = x + (b * L + s) * C + c0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t t = s + (K - 1) - j;
        if (t >= L) continue;
        const float* g = dy + (b * L + t) * C + c0;
        const float* tap = &taps[j * n];
        float* dtap = &dtaps[j * n];
        for (int64_t c = 0; c < n; ++c) {
          acc[c] += tap[c] * g[c];
          dtap[c] += g[c] * as_float(in[c]);
        }
      }
      T* out = dx + (b * L + s) * C + c0;
      for (int64_t c = 0; c < n; ++c) out[c] = static_cast<T>(acc[c]);
    }
  }
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t j = 0; j < K; ++j) dw[c * K + j] = dtaps[j * n + (c - c0)];
  }
}

struct CausalConv : public torch::autograd::Function<CausalConv> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    const auto xc = x.contiguous();
    const auto wf = w.to(at::kFloat).contiguous();
    const int64_t B = x.size(0), L = x.size(1), C = x.size(2), K = wf.size(1);
    auto y = at::empty({B, L, C}, x.options().dtype(at::kFloat));
    const float* wp = wf.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    if (xc.scalar_type() == at::kBFloat16) {
      const auto* xp = xc.data_ptr<at::BFloat16>();
      parallel_ranges(C, 16, [&](int64_t c0, int64_t c1) {
        conv_forward(xp, wp, yp, B, L, C, K, c0, c1);
      });
    } else {
      const float* xp = xc.data_ptr<float>();
      parallel_ranges(C, 16, [&](int64_t c0, int64_t c1) {
        conv_forward(xp, wp, yp, B, L, C, K, c0, c1);
      });
    }
    ctx->save_for_backward({xc, w});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    const auto wf = w.to(at::kFloat).contiguous();
    const auto dy = grads[0].to(at::kFloat).contiguous();
    const int64_t B = x.size(0), L = x.size(1), C = x.size(2), K = wf.size(1);
    auto dx = at::empty_like(x);
    auto dw = at::empty({C, K}, wf.options());
    const float *wp = wf.data_ptr<float>(), *gp = dy.data_ptr<float>();
    float* dwp = dw.data_ptr<float>();
    if (x.scalar_type() == at::kBFloat16) {
      const auto* xp = x.data_ptr<at::BFloat16>();
      auto* dxp = dx.data_ptr<at::BFloat16>();
      parallel_ranges(C, 16, [&](int64_t c0, int64_t c1) {
        conv_backward(xp, wp, gp, dxp, dwp, B, L, C, K, c0, c1);
      });
    } else {
      const float* xp = x.data_ptr<float>();
      float* dxp = dx.data_ptr<float>();
      parallel_ranges(C, 16, [&](int64_t c0, int64_t c1) {
        conv_backward(xp, wp, gp, dxp, dwp, B, L, C, K, c0, c1);
      });
    }
    return {dx, dw.to(w.scalar_type()).view(w.sizes())};
  }
};

}  // namespace

at::Tensor causal_conv(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "causal_conv: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "causal_conv: f32 or bf16 input");
  TORCH_CHECK(x.dim() == 3 && w.dim() == 2 && w.size(0) == x.size(2) && w.size(1) > 0,
              "causal_conv: x (B, T, C) and taps (C, kernel) expected");
  return CausalConv::apply(x, w);
}

}  // namespace vlc_kernels
