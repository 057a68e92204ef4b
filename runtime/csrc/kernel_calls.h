// The CPU kernels of kernels.h (Gated DeltaNet's delta rule, causal convolution, gated norm).
// Declared here, defined in kernel_calls.cpp, bound in src/ffi.rs (checked by build.rs).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

int vlc_have_cpu_kernels(void);
char* vlc_chunk_gated_delta_rule(void* q, void* k, void* v, void* g, void* beta, void* initial,
                                 int64_t chunk, double scale, void** out, void** last);
char* vlc_causal_conv(void* x, void* w, void** out);
char* vlc_gated_rms_norm(void* x, void* s, void* w, double eps, int out_bf16, void** out);

#ifdef __cplusplus
}  // extern "C"
#endif
