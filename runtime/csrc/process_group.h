// Gloo and NCCL process groups (c10d backends) and their collectives.
// Declared here, defined in process_group.cpp, bound in src/ffi.rs (checked by build.rs).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vlc_pg vlc_pg;

char* vlc_pg_gloo_new(const vlc_store* store, int rank, int size, int64_t timeout_ms,
                      const char* iface, const char* hostname, int threads, vlc_pg** out);
int vlc_has_nccl(void);
char* vlc_pg_nccl_new(const vlc_store* store, int rank, int size, int64_t timeout_ms, vlc_pg** out);
void vlc_pg_free(vlc_pg* pg);
char* vlc_pg_allreduce(vlc_pg* pg, void* const* tensors, size_t n, int op, int64_t timeout_ms);
char* vlc_pg_allgather_into(vlc_pg* pg, void* output, void* input, int64_t timeout_ms);
char* vlc_pg_reduce_scatter(vlc_pg* pg, void* output, void* input, int op, int64_t timeout_ms);
char* vlc_pg_broadcast(vlc_pg* pg, void* const* tensors, size_t n, int root, int64_t timeout_ms);
char* vlc_pg_send(vlc_pg* pg, void* tensor, int dst, int tag, int64_t timeout_ms);
char* vlc_pg_recv(vlc_pg* pg, void* tensor, int src, int tag, int64_t timeout_ms);
char* vlc_pg_barrier(vlc_pg* pg, int64_t timeout_ms);

#ifdef __cplusplus
}  // extern "C"
#endif
