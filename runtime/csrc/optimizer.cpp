// optimizer.h: torch's fused and foreach optimizer kernels.
#include "boundary.h"
#include "optimizer.h"
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <cmath>

using namespace vlc;

extern "C" {

// torch.optim.AdamW(fused=True) for one device/dtype bucket. The caller increments
// `state_steps` (fp32 scalars) before the call, as torch does.
char* vlc_fused_adamw(void* const* params, void* const* grads, void* const* exp_avgs,
                      void* const* exp_avg_sqs, void* const* state_steps, size_t n, double lr,
                      double beta1, double beta2, double weight_decay, double eps, int maximize,
                      void* grad_scale, void* found_inf) {
  return guarded([&] {
    auto p = tensor_list(params, n);
    auto g = tensor_list(grads, n);
    auto m = tensor_list(exp_avgs, n);
    auto v = tensor_list(exp_avg_sqs, n);
    auto s = tensor_list(state_steps, n);
    std::vector<at::Tensor> none;
    at::_fused_adamw_(p, g, m, v, none, s, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, maximize != 0, optional_tensor(grad_scale),
                      optional_tensor(found_inf));
  });
}

// torch.optim.AdamW's default (foreach) step, `_multi_tensor_adam` with decoupled weight decay,
// op by op: each op rounds to the tensors' dtype, which for bf16 params and state is what a
// torch optimizer over a bf16 model computes (the fused kernel rounds once per element).
// `steps` holds each tensor's step count, already incremented; bias corrections are taken on
// the host in double, as torch does for non-capturable steps.
char* vlc_foreach_adamw(void* const* params, void* const* grads, void* const* exp_avgs,
                        void* const* exp_avg_sqs, const double* steps, size_t n, double lr,
                        double beta1, double beta2, double weight_decay, double eps) {
  return guarded([&] {
    auto p = tensor_list(params, n);
    auto g = tensor_list(grads, n);
    auto m = tensor_list(exp_avgs, n);
    auto v = tensor_list(exp_avg_sqs, n);
    if (weight_decay != 0.0) at::_foreach_mul_(p, at::Scalar(1.0 - lr * weight_decay));
    at::_foreach_lerp_(m, g, at::Scalar(1.0 - beta1));
    at::_foreach_mul_(v, at::Scalar(beta2));
    at::_foreach_addcmul_(v, g, g, at::Scalar(1.0 - beta2));
    std::vector<at::Scalar> step_size, bc2_sqrt;
    for (size_t i = 0; i < n; ++i) {
      double bc1 = 1.0 - std::pow(beta1, steps[i]);
      double bc2 = 1.0 - std::pow(beta2, steps[i]);
      step_size.emplace_back((lr / bc1) * -1.0);
      bc2_sqrt.emplace_back(std::pow(bc2, 0.5));
    }
    auto denom = at::_foreach_sqrt(v);
    at::_foreach_div_(denom, bc2_sqrt);
    at::_foreach_add_(denom, at::Scalar(eps));
    at::_foreach_addcdiv_(p, m, denom, step_size);
  });
}

// torch.optim.SGD(fused=True): with momentum, `is_first_step` initialises the buffers to the grad.
char* vlc_fused_sgd(void* const* params, void* const* grads, void* const* momentum_bufs, size_t n,
                    double weight_decay, double momentum, double lr, double dampening,
                    int nesterov, int maximize, int is_first_step, void* grad_scale,
                    void* found_inf) {
  return guarded([&] {
    auto p = tensor_list(params, n);
    auto g = tensor_list(grads, n);
    std::vector<at::Tensor> b;
    if (momentum != 0.0) b = tensor_list(momentum_bufs, n);
    at::_fused_sgd_(p, g, b, weight_decay, momentum, lr, dampening, nesterov != 0,
                    maximize != 0, is_first_step != 0, optional_tensor(grad_scale),
                    optional_tensor(found_inf));
  });
}

// grads *= inv_scale in place; found_inf := 1 if any element is non-finite (else unchanged).
char* vlc_foreach_non_finite_check_and_unscale(void* const* grads, size_t n, void* found_inf,
                                               void* inv_scale) {
  return guarded([&] {
    auto g = tensor_list(grads, n);
    at::_amp_foreach_non_finite_check_and_unscale_(g, T(found_inf), T(inv_scale));
  });
}

// out[i] receives a new tensor (ownership passes to the caller, tch frees it).
char* vlc_foreach_norm(void* const* tensors, size_t n, double ord, void** out) {
  return guarded([&] {
    auto ts = tensor_list(tensors, n);
    auto norms = at::_foreach_norm(ts, ord, at::kFloat);
    for (size_t i = 0; i < n; ++i) out[i] = new at::Tensor(norms[i]);
  });
}

char* vlc_foreach_copy(void* const* dst, void* const* src, size_t n, int non_blocking) {
  return guarded([&] {
    auto d = tensor_list(dst, n);
    auto s = tensor_list(src, n);
    at::_foreach_copy_(d, s, non_blocking != 0);
  });
}

char* vlc_foreach_mul_scalar(void* const* tensors, size_t n, double s) {
  return guarded([&] {
    auto ts = tensor_list(tensors, n);
    at::_foreach_mul_(ts, at::Scalar(s));
  });
}

char* vlc_foreach_mul_tensor(void* const* tensors, size_t n, void* scalar) {
  return guarded([&] {
    auto ts = tensor_list(tensors, n);
    at::_foreach_mul_(ts, T(scalar));
  });
}

}  // extern "C"
