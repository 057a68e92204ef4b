// C ABI over the parts of libtorch that tch does not bind: c10d (TCPStore, PrefixStore,
// ProcessGroupGloo, ProcessGroupNCCL) and the fused / foreach optimizer kernels.
//
// Conventions (mirrored in src/ffi.rs):
// - Tensors cross the boundary as `at::Tensor*` (tch's `C_tensor*`), borrowed for the call.
// - Every fallible function returns `char*`: NULL on success, otherwise a malloc'd message that
//   the caller releases with `vlc_free_error`. No C++ exception ever crosses the boundary.
// - Timeouts are milliseconds; a non-positive value means "the group's default".
#include <cmath>
#include <ATen/ATen.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef VERLC_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "kernels.h"

// csrc/gloo_pacing.cpp
extern "C" void vlc_gloo_pacing_arm(void);

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

char* dup_message(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) {
    return nullptr;
  }
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

// Runs `f`, turning any exception into an error string.
template <typename F>
char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const c10::Error& e) {
    return dup_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return dup_message(e.what());
  } catch (...) {
    return dup_message("unknown C++ exception");
  }
}

at::Tensor& T(void* p) {
  return *static_cast<at::Tensor*>(p);
}

std::vector<at::Tensor> tensor_list(void* const* ptrs, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(T(ptrs[i]));
  }
  return out;
}

std::optional<at::Tensor> optional_tensor(void* p) {
  if (p == nullptr) {
    return std::nullopt;
  }
  return T(p);
}

std::chrono::milliseconds ms(int64_t v) {
  return std::chrono::milliseconds(v);
}

}  // namespace

struct vlc_store {
  c10::intrusive_ptr<c10d::Store> store;
};

struct vlc_pg {
  c10::intrusive_ptr<c10d::Backend> backend;
  int size;
  bool native_avg;  // NCCL reduces with AVG itself; Gloo sums and divides here.
  std::chrono::milliseconds timeout;
};

namespace {

// Waits for `work`, bounded by the op timeout, so that a dead or stuck peer is an error.
void wait_work(const vlc_pg* pg, const c10::intrusive_ptr<c10d::Work>& work, int64_t timeout_ms) {
  auto timeout = timeout_ms > 0 ? ms(timeout_ms) : pg->timeout;
  if (!work->wait(timeout)) {
    std::rethrow_exception(work->exception());
  }
}

// 0 sum, 1 avg, 2 max, 3 min, 4 product (see ReduceOp in src/dist/group.rs).
c10d::ReduceOp reduce_op(int op, bool native_avg) {
  switch (op) {
    case 0:
      return c10d::ReduceOp::SUM;
    case 1:
      return native_avg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
    case 2:
      return c10d::ReduceOp::MAX;
    case 3:
      return c10d::ReduceOp::MIN;
    case 4:
      return c10d::ReduceOp::PRODUCT;
    default:
      TORCH_CHECK(false, "unknown reduce op code ", op);
  }
}

void finish_avg(const vlc_pg* pg, int op, at::Tensor& t) {
  if (op == 1 && !pg->native_avg) {
    TORCH_CHECK(at::isFloatingType(t.scalar_type()), "ReduceOp::Avg needs a floating-point tensor");
    t.div_(pg->size);
  }
}

}  // namespace

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

vlc_pg* pg_of(AutogradContext* ctx) {
  return reinterpret_cast<vlc_pg*>(ctx->saved_data["pg"].toInt());
}

// `x` cut into `size` equal chunks along `scatter_dim`, chunk j sent to rank j, and the chunks
// received from every rank joined along `gather_dim` in rank order.
at::Tensor all_to_all(vlc_pg* pg, const at::Tensor& x, int64_t scatter_dim, int64_t gather_dim) {
  auto input = at::stack(x.chunk(pg->size, scatter_dim), 0).contiguous();
  auto output = at::empty_like(input);
  std::vector<int64_t> equal;
  wait_work(pg, pg->backend->alltoall_base(output, input, equal, equal, c10d::AllToAllOptions()), 0);
  return at::cat(output.unbind(0), gather_dim);
}

// Ulysses' exchange between sequence shards and head shards; its gradient is the exchange back.
struct SequenceAllToAll : public torch::autograd::Function<SequenceAllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t pg,
                            int64_t scatter_dim, int64_t gather_dim) {
    ctx->saved_data["pg"] = pg;
    ctx->saved_data["scatter"] = scatter_dim;
    ctx->saved_data["gather"] = gather_dim;
    return all_to_all(reinterpret_cast<vlc_pg*>(pg), x, scatter_dim, gather_dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = all_to_all(pg_of(ctx), grads[0].contiguous(), ctx->saved_data["gather"].toInt(),
                        ctx->saved_data["scatter"].toInt());
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Rows of `x` (dim 0) in blocks of `send[r]` rows to rank r; the blocks received, `recv[r]`
// rows from rank r, joined in rank order.
at::Tensor all_to_all_rows(vlc_pg* pg, const at::Tensor& x, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv) {
  int64_t rows = 0;
  for (auto n : recv) rows += n;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[0] = rows;
  auto input = x.contiguous();
  auto output = at::empty(shape, input.options());
  auto out_splits = recv;
  auto in_splits = send;
  wait_work(pg, pg->backend->alltoall_base(output, input, out_splits, in_splits,
                                           c10d::AllToAllOptions()), 0);
  return output;
}

// Expert parallelism's token exchange with uneven blocks; its gradient is the exchange back.
struct RowsAllToAll : public torch::autograd::Function<RowsAllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t pg,
                            std::vector<int64_t> send, std::vector<int64_t> recv) {
    ctx->saved_data["pg"] = pg;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return all_to_all_rows(reinterpret_cast<vlc_pg*>(pg), x, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto send = ctx->saved_data["send"].toIntVector();
    auto recv = ctx->saved_data["recv"].toIntVector();
    auto g = all_to_all_rows(pg_of(ctx), grads[0], recv, send);
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Every rank's `x` joined along `dim` in rank order. The gradient is this rank's slice of the
// incoming one: every rank computes the same function of the gathered tensor, so each keeps
// the part that flows back to its own input.
struct GatherSame : public torch::autograd::Function<GatherSame> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t pg, int64_t dim) {
    ctx->saved_data["pg"] = pg;
    ctx->saved_data["dim"] = dim;
    auto* p = reinterpret_cast<vlc_pg*>(pg);
    auto input = x.contiguous().view({-1});
    auto output = at::empty({p->size * input.numel()}, input.options());
    wait_work(p, p->backend->_allgather_base(output, input, c10d::AllgatherOptions()), 0);
    std::vector<int64_t> shape{p->size};
    for (auto d : x.sizes()) shape.push_back(d);
    return at::cat(output.view(shape).unbind(0), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* p = pg_of(ctx);
    auto g = grads[0].chunk(p->size, ctx->saved_data["dim"].toInt())[p->backend->getRank()];
    return {g.contiguous(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

void vlc_free_error(char* e) {
  std::free(e);
}

// ---------------------------------------------------------------------------------------- store

char* vlc_tcpstore_new(const char* host, uint16_t port, int world_size, int is_server,
                       int64_t timeout_ms, vlc_store** out) {
  return guarded([&] {
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server != 0;
    opts.numWorkers = world_size > 0 ? std::optional<std::size_t>(world_size) : std::nullopt;
    opts.waitWorkers = true;
    opts.timeout = ms(timeout_ms);
    opts.multiTenant = true;
    auto store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    *out = new vlc_store{store};
  });
}

char* vlc_prefixstore_new(const char* prefix, const vlc_store* base, vlc_store** out) {
  return guarded([&] {
    auto store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), base->store);
    *out = new vlc_store{store};
  });
}

void vlc_store_free(vlc_store* s) {
  delete s;
}

char* vlc_store_set(vlc_store* s, const char* key, const uint8_t* data, size_t len) {
  return guarded([&] { s->store->set(std::string(key), std::vector<uint8_t>(data, data + len)); });
}

// `*data` is malloc'd; release it with vlc_free_bytes.
char* vlc_store_get(vlc_store* s, const char* key, uint8_t** data, size_t* len) {
  return guarded([&] {
    auto v = s->store->get(std::string(key));
    *len = v.size();
    *data = static_cast<uint8_t*>(std::malloc(v.size() > 0 ? v.size() : 1));
    TORCH_CHECK(*data != nullptr, "out of memory");
    if (!v.empty()) {
      std::memcpy(*data, v.data(), v.size());
    }
  });
}

void vlc_free_bytes(uint8_t* p) {
  std::free(p);
}

char* vlc_store_add(vlc_store* s, const char* key, int64_t value, int64_t* out) {
  return guarded([&] { *out = s->store->add(std::string(key), value); });
}

char* vlc_store_set_timeout(vlc_store* s, int64_t timeout_ms) {
  return guarded([&] { s->store->setTimeout(ms(timeout_ms)); });
}

// ------------------------------------------------------------------------------ process groups

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

// ------------------------------------------------------------------------ storage offload

// Frees the memory of `t`'s storage (what torch's `untyped_storage().resize_(0)` does): every
// tensor viewing that storage keeps its shape and strides but has no data until
// vlc_storage_alloc gives the storage memory again.
char* vlc_storage_free(void* t) {
  return guarded([&] {
    c10::StorageImpl* impl = T(t).storage().unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(at::DataPtr(nullptr, T(t).device()));
    impl->set_nbytes(0);
  });
}

// Gives `t`'s storage `nbytes` of fresh, uninitialised memory from its own allocator (the
// device's caching allocator on CUDA); the caller copies the contents back.
char* vlc_storage_alloc(void* t, size_t nbytes) {
  return guarded([&] {
    c10::StorageImpl* impl = T(t).storage().unsafeGetStorageImpl();
    TORCH_CHECK(impl->allocator() != nullptr, "the storage has no allocator");
    impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
    impl->set_nbytes(nbytes);
  });
}

// Bytes of `t`'s storage (0 while freed).
size_t vlc_storage_nbytes(void* t) {
  return T(t).storage().nbytes();
}

// ------------------------------------------------------------------------ optimizer kernels

// torch.optim.AdamW(fused=True) for one device/dtype bucket. The caller increments
// `state_steps` (fp32 scalars) before the call, as torch does.
char* vlc_fused_adamw(void* const* params, void* const* grads, void* const* exp_avgs,
                      void* const* exp_avg_sqs, void* const* state_steps, size_t n, double lr,
                      double beta1, double beta2, double weight_decay, double eps, int maximize,
                      void* grad_scale, void* found_inf) {
  return guarded([&] {
    auto p = tensor_list(params, n);
    auto g = tensor_list(grads, n);
    auto m = tensor_list(exp_avgs, n);
    auto v = tensor_list(exp_avg_sqs, n);
    auto s = tensor_list(state_steps, n);
    std::vector<at::Tensor> none;
    at::_fused_adamw_(p, g, m, v, none, s, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, maximize != 0, optional_tensor(grad_scale),
                      optional_tensor(found_inf));
  });
}

// torch.optim.AdamW's default (foreach) step, `_multi_tensor_adam` with decoupled weight decay,
// op by op: each op rounds to the tensors' dtype, which for bf16 params and state is what a
// torch optimizer over a bf16 model computes (the fused kernel rounds once per element).
// `steps` holds each tensor's step count, already incremented; bias corrections are taken on
// the host in double, as torch does for non-capturable steps.
char* vlc_foreach_adamw(void* const* params, void* const* grads, void* const* exp_avgs,
                        void* const* exp_avg_sqs, const double* steps, size_t n, double lr,
                        double beta1, double beta2, double weight_decay, double eps) {
  return guarded([&] {
    auto p = tensor_list(params, n);
    auto g = tensor_list(grads, n);
    auto m = tensor_list(exp_avgs, n);
    auto v = tensor_list(exp_avg_sqs, n);
    if (weight_decay != 0.0) at::_foreach_mul_(p, at::Scalar(1.0 - lr * weight_decay));
    at::_foreach_lerp_(m, g, at::Scalar(1.0 - beta1));
    at::_foreach_mul_(v, at::Scalar(beta2));
    at::_foreach_addcmul_(v, g, g, at::Scalar(1.0 - beta2));
    std::vector<at::Scalar> step_size, bc2_sqrt;
    for (size_t i = 0; i < n; ++i) {
      double bc1 = 1.0 - std::pow(beta1, steps[i]);
      double bc2 = 1.0 - std::pow(beta2, steps[i]);
      step_size.emplace_back((lr / bc1) * -1.0);
      bc2_sqrt.emplace_back(std::pow(bc2, 0.5));
    }
    auto denom = at::_foreach_sqrt(v);
    at::_foreach_div_(denom, bc2_sqrt);
    at::_foreach_add_(denom, at::Scalar(eps));
    at::_foreach_addcdiv_(p, m, denom, step_size);
  });
}

// torch.optim.SGD(fused=True): with momentum, `is_first_step` initialises the buffers to the grad.
char* vlc_fused_sgd(void* const* params, void* const* grads, void* const* momentum_bufs, size_t n,
                    double weight_decay, double momentum, double lr, double dampening,
                    int nesterov, int maximize, int is_first_step, void* grad_scale,
                    void* found_inf) {
  return guarded([&] {
    auto p = tensor_list(params, n);
    auto g = tensor_list(grads, n);
    std::vector<at::Tensor> b;
    if (momentum != 0.0) b = tensor_list(momentum_bufs, n);
    at::_fused_sgd_(p, g, b, weight_decay, momentum, lr, dampening, nesterov != 0,
                    maximize != 0, is_first_step != 0, optional_tensor(grad_scale),
                    optional_tensor(found_inf));
  });
}

// grads *= inv_scale in place; found_inf := 1 if any element is non-finite (else unchanged).
char* vlc_foreach_non_finite_check_and_unscale(void* const* grads, size_t n, void* found_inf,
                                               void* inv_scale) {
  return guarded([&] {
    auto g = tensor_list(grads, n);
    at::_amp_foreach_non_finite_check_and_unscale_(g, T(found_inf), T(inv_scale));
  });
}

// out[i] receives a new tensor (ownership passes to the caller, tch frees it).
char* vlc_foreach_norm(void* const* tensors, size_t n, double ord, void** out) {
  return guarded([&] {
    auto ts = tensor_list(tensors, n);
    auto norms = at::_foreach_norm(ts, ord, at::kFloat);
    for (size_t i = 0; i < n; ++i) out[i] = new at::Tensor(norms[i]);
  });
}

char* vlc_foreach_copy(void* const* dst, void* const* src, size_t n, int non_blocking) {
  return guarded([&] {
    auto d = tensor_list(dst, n);
    auto s = tensor_list(src, n);
    at::_foreach_copy_(d, s, non_blocking != 0);
  });
}

char* vlc_foreach_mul_scalar(void* const* tensors, size_t n, double s) {
  return guarded([&] {
    auto ts = tensor_list(tensors, n);
    at::_foreach_mul_(ts, at::Scalar(s));
  });
}

char* vlc_foreach_mul_tensor(void* const* tensors, size_t n, void* scalar) {
  return guarded([&] {
    auto ts = tensor_list(tensors, n);
    at::_foreach_mul_(ts, T(scalar));
  });
}

// ------------------------------------------------------------------------------ autograd bits

char* vlc_tensor_set_grad(void* tensor, void* grad) {
  return guarded([&] {
    if (grad == nullptr) {
      T(tensor).mutable_grad().reset();
    } else {
      T(tensor).mutable_grad() = T(grad);
    }
  });
}

// `torch.autograd.backward(tensors, grad_tensors)`: one backward pass from several roots, each
// with its incoming gradient, accumulating into the leaves' `.grad` (tch binds only the scalar
// form). Used by the segment-wise backward of the tensor/pipeline-parallel mappings.
char* vlc_autograd_backward(void* const* tensors, void* const* grads, size_t n, int keep_graph) {
  return guarded([&] {
    auto ts = tensor_list(tensors, n);
    auto gs = tensor_list(grads, n);
    torch::autograd::backward(ts, gs, keep_graph != 0, false);
  });
}

// Differentiable Ulysses all-to-all of `x` over `pg` (see SequenceAllToAll); `*out` receives a
// new tensor the caller owns. The group must outlive the autograd graph.
char* vlc_sp_all_to_all(vlc_pg* pg, void* x, int64_t scatter_dim, int64_t gather_dim, void** out) {
  return guarded([&] {
    TORCH_CHECK(T(x).size(scatter_dim) % pg->size == 0, "all_to_all: dimension ", scatter_dim,
                " of size ", T(x).size(scatter_dim), " does not split over ", pg->size, " ranks");
    *out = new at::Tensor(
        SequenceAllToAll::apply(T(x), reinterpret_cast<int64_t>(pg), scatter_dim, gather_dim));
  });
}

// Differentiable exchange of row blocks (see RowsAllToAll): `n` counts per array; `*out` as
// in vlc_sp_all_to_all.
char* vlc_ep_all_to_all(vlc_pg* pg, void* x, const int64_t* send, const int64_t* recv, int64_t n,
                        void** out) {
  return guarded([&] {
    TORCH_CHECK(n == pg->size, "all_to_all: ", n, " blocks for ", pg->size, " ranks");
    std::vector<int64_t> s(send, send + n), r(recv, recv + n);
    int64_t total = 0;
    for (auto v : s) total += v;
    TORCH_CHECK(total == T(x).size(0), "all_to_all: blocks of ", total, " rows for ",
                T(x).size(0), " rows");
    *out = new at::Tensor(RowsAllToAll::apply(T(x), reinterpret_cast<int64_t>(pg), s, r));
  });
}

// Differentiable all-gather of `x` along `dim` (see GatherSame); `*out` as above.
char* vlc_sp_gather_same(vlc_pg* pg, void* x, int64_t dim, void** out) {
  return guarded([&] {
    *out = new at::Tensor(GatherSame::apply(T(x), reinterpret_cast<int64_t>(pg), dim));
  });
}

// Whether the CPU kernels of kernels.h can run in this process (1) or not (0).
int vlc_have_cpu_kernels(void) {
  return vlc_kernels::have_blas() ? 1 : 0;
}

// The chunked gated delta rule (kernels.h); `*out` and `*last` receive new tensors the caller
// owns.
char* vlc_chunk_gated_delta_rule(void* q, void* k, void* v, void* g, void* beta, void* initial,
                                 int64_t chunk, double scale, void** out, void** last) {
  return guarded([&] {
    auto r = vlc_kernels::chunk_gated_delta_rule(T(q), T(k), T(v), T(g), T(beta), T(initial),
                                                 chunk, scale);
    *out = new at::Tensor(r[0]);
    *last = new at::Tensor(r[1]);
  });
}

// The causal depthwise convolution (kernels.h); `*out` as above.
char* vlc_causal_conv(void* x, void* w, void** out) {
  return guarded([&] { *out = new at::Tensor(vlc_kernels::causal_conv(T(x), T(w))); });
}

// The gated output norm (kernels.h); `out_bf16` picks a bf16 output over f32; `*out` as above.
char* vlc_gated_rms_norm(void* x, void* s, void* w, double eps, int out_bf16, void** out) {
  return guarded([&] {
    *out = new at::Tensor(vlc_kernels::gated_rms_norm(
        T(x), T(s), T(w), eps, out_bf16 != 0 ? at::kBFloat16 : at::kFloat));
  });
}

}  // extern "C"
