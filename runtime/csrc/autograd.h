// What tch does not bind of autograd: setting a gradient, a backward from several roots.
// Declared here, defined in autograd.cpp, bound in src/ffi.rs (checked by build.rs).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

char* vlc_tensor_set_grad(void* tensor, void* grad);
char* vlc_autograd_backward(void* const* tensors, void* const* grads, size_t n, int keep_graph);

#ifdef __cplusplus
}  // extern "C"
#endif
