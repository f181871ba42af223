// Lazy kernels, written with ops that trace (mydev_lazy_ops.yaml), of ops that
// are not in the list because their traced form would be wrong or would not
// trace: the first would compute something else than eager mydev, the second
// would run through the eager fallback (EagerFallback.cpp) and cut the traced
// graph in two.
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

// native_dropout has no generator argument: traced as itself, a program would
// run ATen's CPU kernel, which draws from the CPU's generator. Its mask comes
// from bernoulli.p instead, which a program runs with the device's generator,
// composed as mydev's eager kernel does (csrc/native/Random.cpp) so that both
// draw the same numbers from the same seed.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (input.numel() == 0 || !train.value_or(true) || p == 0) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  if (p == 1) {
    return {at::zeros_like(input), at::zeros_like(input, input.options().dtype(at::kBool))};
  }
  const at::Tensor keep = at::bernoulli(input, 1 - p);
  return {input.mul(keep).mul(1.0 / (1.0 - p)), keep.to(at::kBool)};
}

} // namespace

void register_lazy_decompositions() {
  static torch::Library library(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
  library.impl("_safe_softmax", TORCH_FN(safe_softmax));
  library.impl("native_dropout", TORCH_FN(native_dropout));
}

} // namespace my_device::lazy
