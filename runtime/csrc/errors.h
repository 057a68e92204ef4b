// Releasing what the shim hands over, and the ABI's conventions (every header of the shim follows them):
// - tensors cross the boundary as `at::Tensor*` (tch's `C_tensor*`), borrowed for the call;
// - every fallible function returns `char*`: NULL on success, otherwise a malloc'd message the
//   caller releases with vlc_free_error; no C++ exception crosses the boundary;
// - timeouts are milliseconds; a non-positive value means "the group's default";
// - a tensor written to an `out` argument is new and owned by the caller.
// Declared here, defined in errors.cpp, bound in src/ffi.rs (checked by build.rs).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void vlc_free_error(char* e);
void vlc_free_bytes(uint8_t* p);

#ifdef __cplusplus
}  // extern "C"
#endif
