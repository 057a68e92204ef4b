// What every C ABI file of the shim shares (internal, C++ only): exceptions turned into the
// error strings the ABI returns, tensors borrowed from tch's pointers, and the c10d handles
// behind the opaque `vlc_store` / `vlc_pg` of store.h and process_group.h.
//
// The ABI's conventions (errors.h) are mirrored in src/ffi.rs, whose declarations the build
// checks against the headers (build_support/ffi_check.rs).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "errors.h"

// gloo_pacing.cpp: reads VERLC_GLOO_PACING when a Gloo group is created (process_group.cpp).
// Internal to the shim, so not in a header src/ffi.rs binds.
extern "C" void vlc_gloo_pacing_arm(void);

namespace vlc {

inline char* dup_message(const std::string& s) {
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

inline at::Tensor& T(void* p) {
  return *static_cast<at::Tensor*>(p);
}

inline std::vector<at::Tensor> tensor_list(void* const* ptrs, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(T(ptrs[i]));
  }
  return out;
}

inline std::optional<at::Tensor> optional_tensor(void* p) {
  if (p == nullptr) {
    return std::nullopt;
  }
  return T(p);
}

inline std::chrono::milliseconds ms(int64_t v) {
  return std::chrono::milliseconds(v);
}

}  // namespace vlc

struct vlc_store {
  c10::intrusive_ptr<c10d::Store> store;
};

struct vlc_pg {
  c10::intrusive_ptr<c10d::Backend> backend;
  int size;
  bool native_avg;  // NCCL reduces with AVG itself; Gloo sums and divides here.
  std::chrono::milliseconds timeout;
};

namespace vlc {

// Waits for `work`, bounded by the op timeout, so that a dead or stuck peer is an error.
inline void wait_work(const vlc_pg* pg, const c10::intrusive_ptr<c10d::Work>& work, int64_t timeout_ms) {
  auto timeout = timeout_ms > 0 ? ms(timeout_ms) : pg->timeout;
  if (!work->wait(timeout)) {
    std::rethrow_exception(work->exception());
  }
}

// 0 sum, 1 avg, 2 max, 3 min, 4 product (see ReduceOp in src/dist/group.rs).
inline c10d::ReduceOp reduce_op(int op, bool native_avg) {
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

inline void finish_avg(const vlc_pg* pg, int op, at::Tensor& t) {
  if (op == 1 && !pg->native_avg) {
    TORCH_CHECK(at::isFloatingType(t.scalar_type()), "ReduceOp::Avg needs a floating-point tensor");
    t.div_(pg->size);
  }
}

}  // namespace vlc
