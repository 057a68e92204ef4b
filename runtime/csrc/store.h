// c10d's TCPStore and PrefixStore: the rendezvous of a job's processes.
// Declared here, defined in store.cpp, bound in src/ffi.rs (checked by build.rs).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vlc_store vlc_store;

char* vlc_tcpstore_new(const char* host, uint16_t port, int world_size, int is_server,
                       int64_t timeout_ms, vlc_store** out);
char* vlc_prefixstore_new(const char* prefix, const vlc_store* base, vlc_store** out);
void vlc_store_free(vlc_store* s);
char* vlc_store_set(vlc_store* s, const char* key, const uint8_t* data, size_t len);
char* vlc_store_get(vlc_store* s, const char* key, uint8_t** data, size_t* len);
char* vlc_store_add(vlc_store* s, const char* key, int64_t value, int64_t* out);
char* vlc_store_set_timeout(vlc_store* s, int64_t timeout_ms);

#ifdef __cplusplus
}  // extern "C"
#endif
