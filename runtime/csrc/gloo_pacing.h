// Pacing of Gloo's event-loop threads (see gloo_pacing.cpp): its counters, for tests. (Arming
// it is internal to the shim: boundary.h.)
// Declared here, defined in gloo_pacing.cpp, bound in src/ffi.rs (checked by build.rs).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void vlc_gloo_pacing_stats(uint64_t* waits, uint64_t* yields);

#ifdef __cplusplus
}  // extern "C"
#endif
