// The Gated DeltaNet's output norm on CPU, forward and backward: y = w * rmsnorm(x) * s per
// row, with s = silu(gate) given (libtorch's vectorised SiLU computes it).
//
// As tensor ops it is a dozen passes over the (tokens, heads, d_v) activations forward and
// twice as many backward, with dtype conversions between them; here one pass each way.
#include "kernels.h"

#include <c10/util/BFloat16.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <vector>

namespace vlc_kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename T>
VLC_VECTOR_CLONES void norm_forward(const float* x, const float* s, const float* w, T* y,
                                    int64_t d, float eps, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * d;
    const float* sr = s + r * d;
    const float inv = 1.f / std::sqrt(dot(xr, xr, d) / d + eps);
    T* yr = y + r * d;
    for (int64_t j = 0; j < d; ++j) yr[j] = static_cast<T>(w[j] * xr[j] * inv * sr[j]);
  }
}

// n = x inv, a = w n, y = a s: ds = dy a, dw += dy s n, dn = dy s w,
// dx = inv (dn - n mean(dn n)).
template <typename T>
VLC_VECTOR_CLONES void norm_backward(const float* x, const float* s, const float* w,
                                     const T* dy, float* dx, float* ds, float* dw, int64_t d,
                                     float eps, int64_t r0, int64_t r1) {
  std::vector<float> n(d), dn(d);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * d;
    const float* sr = s + r * d;
    const T* gr = dy + r * d;
    const float inv = 1.f / std::sqrt(dot(xr, xr, d) / d + eps);
    for (int64_t j = 0; j < d; ++j) {
      const float g = static_cast<float>(gr[j]);
      n[j] = xr[j] * inv;
      ds[r * d + j] = g * w[j] * n[j];
      dw[j] += g * sr[j] * n[j];
      dn[j] = g * sr[j] * w[j];
    }
    const float mean = dot(dn.data(), n.data(), d) / d;
    for (int64_t j = 0; j < d; ++j) dx[r * d + j] = inv * (dn[j] - n[j] * mean);
  }
}

struct GatedNorm : public torch::autograd::Function<GatedNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& s,
                            const at::Tensor& w, double eps, int64_t out_dtype) {
    const auto dtype = static_cast<at::ScalarType>(out_dtype);
    const auto xc = x.contiguous(), sc = s.contiguous();
    const auto wf = w.to(at::kFloat).contiguous();
    const int64_t d = wf.numel(), rows = xc.numel() / d;
    auto y = at::empty(x.sizes(), x.options().dtype(dtype));
    const float *xp = xc.data_ptr<float>(), *sp = sc.data_ptr<float>(),
                *wp = wf.data_ptr<float>();
    const float e = static_cast<float>(eps);
    if (dtype == at::kBFloat16) {
      auto* yp = y.data_ptr<at::BFloat16>();
      parallel_ranges(rows, 64, [&](int64_t r0, int64_t r1) {
        norm_forward(xp, sp, wp, yp, d, e, r0, r1);
      });
    } else {
      float* yp = y.data_ptr<float>();
      parallel_ranges(rows, 64, [&](int64_t r0, int64_t r1) {
        norm_forward(xp, sp, wp, yp, d, e, r0, r1);
      });
    }
    ctx->save_for_backward({xc, sc, w});
    ctx->saved_data["eps"] = eps;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &s = saved[1], &w = saved[2];
    const auto wf = w.to(at::kFloat).contiguous();
    const int64_t d = wf.numel(), rows = x.numel() / d;
    const float e = static_cast<float>(ctx->saved_data["eps"].toDouble());
    auto dy = grads[0].contiguous();
    if (dy.scalar_type() != at::kBFloat16) dy = dy.to(at::kFloat);
    auto dx = at::empty_like(x), ds = at::empty_like(s);
    auto dw_parts = at::zeros({part_count(rows, 64), d}, wf.options());
    const float *xp = x.data_ptr<float>(), *sp = s.data_ptr<float>(),
                *wp = wf.data_ptr<float>();
    float *dxp = dx.data_ptr<float>(), *dsp = ds.data_ptr<float>(),
          *dwp = dw_parts.data_ptr<float>();
    // Each part of the rows sums its own copy of dw.
    auto run = [&](auto* gp) {
      parallel_parts(rows, 64, [&](int64_t r0, int64_t r1, int64_t part) {
        norm_backward(xp, sp, wp, gp, dxp, dsp, dwp + part * d, d, e, r0, r1);
      });
    };
    if (dy.scalar_type() == at::kBFloat16) {
      run(dy.data_ptr<at::BFloat16>());
    } else {
      run(dy.data_ptr<float>());
    }
    return {dx, ds, dw_parts.sum(0).to(w.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor gated_rms_norm(const at::Tensor& x, const at::Tensor& s, const at::Tensor& w,
                          double eps, at::ScalarType out) {
  TORCH_CHECK(x.device().is_cpu() && s.device().is_cpu() && w.device().is_cpu(),
              "gated_rms_norm: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat && s.scalar_type() == at::kFloat,
              "gated_rms_norm: f32 activations and gate");
  TORCH_CHECK(out == at::kFloat || out == at::kBFloat16, "gated_rms_norm: f32 or bf16 output");
  TORCH_CHECK(w.dim() == 1 && x.dim() >= 1 && x.size(-1) == w.size(0) && s.sizes() == x.sizes(),
              "gated_rms_norm: x and gate (..., d) with weights (d,) expected");
  return GatedNorm::apply(x, s, w, eps, static_cast<int64_t>(out));
}

}  // namespace vlc_kernels
