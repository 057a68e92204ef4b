// storage.h: freeing and re-giving a tensor storage's memory (offload).
#include "boundary.h"
#include "storage.h"

using namespace vlc;

extern "C" {

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

}  // extern "C"
