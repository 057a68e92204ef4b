// process_group.h: Gloo and NCCL process groups and their collectives.
#include "boundary.h"
#include "process_group.h"
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#ifdef VERLC_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

using namespace vlc;

extern "C" {

// `iface`: network interface (GLOO_SOCKET_IFNAME) or NULL; `hostname`: address to bind or NULL.
// With both NULL the device binds the address this host's name resolves to, else loopback.
char* vlc_pg_gloo_new(const vlc_store* store, int rank, int size, int64_t timeout_ms,
                      const char* iface, const char* hostname, int threads, vlc_pg** out) {
  vlc_gloo_pacing_arm();
  return guarded([&] {
    auto opts = c10d::ProcessGroupGloo::Options::create(ms(timeout_ms));
    if (iface != nullptr) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(iface));
    } else if (hostname != nullptr) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    if (threads > 0) {
      opts->threads = threads;
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store->store, rank, size, opts);
    *out = new vlc_pg{pg, size, false, ms(timeout_ms)};
  });
}

int vlc_has_nccl(void) {
#ifdef VERLC_CUDA
  return 1;
#else
  return 0;
#endif
}

char* vlc_pg_nccl_new(const vlc_store* store, int rank, int size, int64_t timeout_ms, vlc_pg** out) {
#ifdef VERLC_CUDA
  return guarded([&] {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = ms(timeout_ms);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store->store, rank, size, opts);
    *out = new vlc_pg{pg, size, true, ms(timeout_ms)};
  });
#else
  (void)store;
  (void)rank;
  (void)size;
  (void)timeout_ms;
  (void)out;
  return dup_message("this build has no NCCL (enable the `cuda` feature of verlc-runtime)");
#endif
}

void vlc_pg_free(vlc_pg* pg) {
  delete pg;
}

char* vlc_pg_allreduce(vlc_pg* pg, void* const* tensors, size_t n, int op, int64_t timeout_ms) {
  return guarded([&] {
    auto ts = tensor_list(tensors, n);
    c10d::AllreduceOptions opts;
    opts.reduceOp = reduce_op(op, pg->native_avg);
    if (timeout_ms > 0) opts.timeout = ms(timeout_ms);
    wait_work(pg, pg->backend->allreduce(ts, opts), timeout_ms);
    for (auto& t : ts) finish_avg(pg, op, t);
  });
}

// `output` holds size * numel(input) elements, rank-major.
char* vlc_pg_allgather_into(vlc_pg* pg, void* output, void* input, int64_t timeout_ms) {
  return guarded([&] {
    c10d::AllgatherOptions opts;
    if (timeout_ms > 0) opts.timeout = ms(timeout_ms);
    wait_work(pg, pg->backend->_allgather_base(T(output), T(input), opts), timeout_ms);
  });
}

// `input` holds size * numel(output) elements; rank r receives the reduced r-th slice.
char* vlc_pg_reduce_scatter(vlc_pg* pg, void* output, void* input, int op, int64_t timeout_ms) {
  return guarded([&] {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = reduce_op(op, pg->native_avg);
    if (timeout_ms > 0) opts.timeout = ms(timeout_ms);
    wait_work(pg, pg->backend->_reduce_scatter_base(T(output), T(input), opts), timeout_ms);
    finish_avg(pg, op, T(output));
  });
}

char* vlc_pg_broadcast(vlc_pg* pg, void* const* tensors, size_t n, int root, int64_t timeout_ms) {
  return guarded([&] {
    auto ts = tensor_list(tensors, n);
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    if (timeout_ms > 0) opts.timeout = ms(timeout_ms);
    wait_work(pg, pg->backend->broadcast(ts, opts), timeout_ms);
  });
}

char* vlc_pg_send(vlc_pg* pg, void* tensor, int dst, int tag, int64_t timeout_ms) {
  return guarded([&] {
    std::vector<at::Tensor> ts{T(tensor)};
    wait_work(pg, pg->backend->send(ts, dst, tag), timeout_ms);
  });
}

char* vlc_pg_recv(vlc_pg* pg, void* tensor, int src, int tag, int64_t timeout_ms) {
  return guarded([&] {
    std::vector<at::Tensor> ts{T(tensor)};
    wait_work(pg, pg->backend->recv(ts, src, tag), timeout_ms);
  });
}

char* vlc_pg_barrier(vlc_pg* pg, int64_t timeout_ms) {
  return guarded([&] {
    c10d::BarrierOptions opts;
    if (timeout_ms > 0) opts.timeout = ms(timeout_ms);
    wait_work(pg, pg->backend->barrier(opts), timeout_ms);
  });
}

}  // extern "C"
