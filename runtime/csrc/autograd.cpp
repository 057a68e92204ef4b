// autograd.h: what tch does not bind of autograd.
#include "boundary.h"
#include "autograd.h"
#include <torch/csrc/autograd/autograd.h>

using namespace vlc;

extern "C" {

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

}  // extern "C"
