// A tensor storage's memory freed and given again (parameter and optimizer offload).
// Declared here, defined in storage.cpp, bound in src/ffi.rs (checked by build.rs).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

char* vlc_storage_free(void* t);
char* vlc_storage_alloc(void* t, size_t nbytes);
size_t vlc_storage_nbytes(void* t);

#ifdef __cplusplus
}  // extern "C"
#endif
