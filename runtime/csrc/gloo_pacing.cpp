// Pacing for Gloo's TCP event loop, by interposing `epoll_wait` and `recv`.
//
// Why: libtorch's Gloo runs one event-loop thread per device ("gloo_tcp_loop") over
// level-triggered epoll. When data arrives on a pair whose mutex another thread holds (the
// ProcessGroupGloo worker posting a send or a receive), the loop's handler gives up at once
// (a try-lock, to avoid a lock-order deadlock) and epoll reports the same readable socket
// again immediately: the loop spins until the holder lets go. Where busy threads outnumber
// cores (several ranks on a laptop, a 2-core CI machine, a CPU smoke run) the spinning thread
// takes the very CPU the lock holder needs to finish; on a 2-core EPYC it was over a third of
// the CPU of a tensor-parallel run, mostly in the kernel.
//
// What: a Gloo loop thread that comes back to epoll_wait after a wake-up in which it read
// nothing (no `recv` since the last return with events) yields the CPU first, so the thread
// holding the pair runs. Every other thread, and every loop iteration that made progress, goes
// straight to the C library. Nothing about what Gloo sends or receives changes.
//
// How it takes effect: these definitions are linked into the executable (vlc_pg_gloo_new
// references this file, so the archive member is pulled in whenever Gloo groups exist); the
// linker exports a symbol that a linked shared library (libtorch_cpu) references, and the
// dynamic loader binds libtorch's calls to the executable's definition first.
// `VERLC_GLOO_PACING=0` turns the yielding off (the calls are still counted).

#include <dlfcn.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "gloo_pacing.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

// 0: not yet decided for this thread, 1: a Gloo loop thread, 2: any other thread.
thread_local int loop_kind = 0;
// The last epoll_wait of this loop thread returned events and nothing has been read since.
thread_local bool woke_without_reading = false;

std::atomic<bool> pacing_on{true};
std::atomic<uint64_t> loop_waits{0};
std::atomic<uint64_t> loop_yields{0};

bool in_gloo_loop() {
  if (loop_kind == 0) {
    // Gloo names the thread before its first epoll_wait.
    char name[17] = {0};
    prctl(PR_GET_NAME, name, 0, 0, 0);
    loop_kind = std::strcmp(name, "gloo_tcp_loop") == 0 ? 1 : 2;
  }
  return loop_kind == 1;
}

template <typename F>
F next_definition(const char* symbol, std::atomic<F>& slot) {
  F f = slot.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = reinterpret_cast<F>(dlsym(RTLD_NEXT, symbol));
    slot.store(f, std::memory_order_release);
  }
  return f;
}

using epoll_wait_fn = int (*)(int, struct epoll_event*, int, int);
using recv_fn = ssize_t (*)(int, void*, size_t, int);
std::atomic<epoll_wait_fn> libc_epoll_wait{nullptr};
std::atomic<recv_fn> libc_recv{nullptr};

}  // namespace

extern "C" {

int epoll_wait(int epfd, struct epoll_event* events, int maxevents, int timeout) {
  epoll_wait_fn real = next_definition("epoll_wait", libc_epoll_wait);
  if (!in_gloo_loop()) {
    return real(epfd, events, maxevents, timeout);
  }
  loop_waits.fetch_add(1, std::memory_order_relaxed);
  if (woke_without_reading && pacing_on.load(std::memory_order_relaxed)) {
    loop_yields.fetch_add(1, std::memory_order_relaxed);
    sched_yield();
  }
  int n = real(epfd, events, maxevents, timeout);
  woke_without_reading = n > 0;
  return n;
}

ssize_t recv(int fd, void* buf, size_t len, int flags) {
  recv_fn real = next_definition("recv", libc_recv);
  if (loop_kind == 1) {
    woke_without_reading = false;
  }
  return real(fd, buf, len, flags);
}

// Called when a Gloo group is created: reads VERLC_GLOO_PACING (and links this file in).
void vlc_gloo_pacing_arm(void) {
  const char* v = std::getenv("VERLC_GLOO_PACING");
  pacing_on.store(!(v != nullptr && std::strcmp(v, "0") == 0), std::memory_order_relaxed);
}

// How many epoll_wait calls of Gloo loop threads went through this file, and how many of them
// yielded first (process totals).
void vlc_gloo_pacing_stats(uint64_t* waits, uint64_t* yields) {
  *waits = loop_waits.load(std::memory_order_relaxed);
  *yields = loop_yields.load(std::memory_order_relaxed);
}

}  // extern "C"
