// Lazy kernels for ops whose default implementation calls ops that have no
// TorchScript lazy kernel: each such op would run through the eager fallback
// (EagerFallback.cpp) and cut the traced graph in two. Written here with ops
// that do trace.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

#include "Lazy.h"

namespace my_device::lazy {

namespace {

// nn.MultiheadAttention's softmax: rows whose every input is -inf give 0, not
// NaN. ATen's own kernel tests the rows with isneginf and all.dim and picks
// with where.self, none of which traces.
at::Tensor safe_softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  const at::Tensor input = dtype.has_value() ? self.to(*dtype) : self;
  const at::Tensor row_max = std::get<0>(input.max(dim, /*keepdim=*/true));
  const at::Tensor fully_masked = row_max.eq(-std::numeric_limits<double>::infinity());
  return at::_softmax(input, dim, /*half_to_float=*/false).masked_fill(fully_masked, 0);
}

} // namespace

void register_lazy_decompositions() {
  static torch::Library library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
  library.impl("_safe_softmax", TORCH_FN(safe_softmax));
}

} // namespace my_device::lazy
