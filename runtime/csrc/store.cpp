// store.h: c10d's TCPStore and PrefixStore.
#include "boundary.h"
#include "store.h"
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

using namespace vlc;

extern "C" {

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

char* vlc_store_add(vlc_store* s, const char* key, int64_t value, int64_t* out) {
  return guarded([&] { *out = s->store->add(std::string(key), value); });
}

char* vlc_store_set_timeout(vlc_store* s, int64_t timeout_ms) {
  return guarded([&] { s->store->setTimeout(ms(timeout_ms)); });
}

}  // extern "C"
