// torch's fused and foreach optimizer kernels (AdamW, SGD, unscaling, norms).
// Declared here, defined in optimizer.cpp, bound in src/ffi.rs (checked by build.rs).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

char* vlc_fused_adamw(void* const* params, void* const* grads, void* const* exp_avgs,
                      void* const* exp_avg_sqs, void* const* state_steps, size_t n, double lr,
                      double beta1, double beta2, double weight_decay, double eps, int maximize,
                      void* grad_scale, void* found_inf);
char* vlc_foreach_adamw(void* const* params, void* const* grads, void* const* exp_avgs,
                        void* const* exp_avg_sqs, const double* steps, size_t n, double lr,
                        double beta1, double beta2, double weight_decay, double eps);
char* vlc_fused_sgd(void* const* params, void* const* grads, void* const* momentum_bufs, size_t n,
                    double weight_decay, double momentum, double lr, double dampening, int nesterov,
                    int maximize, int is_first_step, void* grad_scale, void* found_inf);
char* vlc_foreach_non_finite_check_and_unscale(void* const* grads, size_t n, void* found_inf,
                                               void* inv_scale);
char* vlc_foreach_norm(void* const* tensors, size_t n, double ord, void** out);
char* vlc_foreach_copy(void* const* dst, void* const* src, size_t n, int non_blocking);
char* vlc_foreach_mul_scalar(void* const* tensors, size_t n, double s);
char* vlc_foreach_mul_tensor(void* const* tensors, size_t n, void* scalar);

#ifdef __cplusplus
}  // extern "C"
#endif
