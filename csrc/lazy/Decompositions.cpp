// Lazy kernels, written with ops that trace (mydev_lazy_ops.yaml), of ops that
// are not in the list because their traced form would be wrong or would not
// trace: the first would compute something else than eager mydev, the second
// would run through the eager fallback (EagerFallback.cpp) and cut the traced
// graph in two.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

#include "Lazy.h"
#include "native/Random.h"

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
  // native_dropout has no generator argument: traced as itself, a program would
  // run ATen's CPU kernel, which draws from the CPU's generator.
  library.impl("native_dropout", TORCH_FN(native_dropout_by_bernoulli));
}

} // namespace my_device::lazy
