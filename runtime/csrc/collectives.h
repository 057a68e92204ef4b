// Differentiable collectives over a process group: their gradients are the exchange back.
// Declared here, defined in collectives.cpp, bound in src/ffi.rs (checked by build.rs).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "process_group.h"

#ifdef __cplusplus
extern "C" {
#endif

char* vlc_sp_all_to_all(vlc_pg* pg, void* x, int64_t scatter_dim, int64_t gather_dim, void** out);
char* vlc_ep_all_to_all(vlc_pg* pg, void* x, const int64_t* send, const int64_t* recv, int64_t n,
                        void** out);
char* vlc_sp_gather_same(vlc_pg* pg, void* x, int64_t dim, void** out);

#ifdef __cplusplus
}  // extern "C"
#endif
