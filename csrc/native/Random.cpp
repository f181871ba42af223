// Random kernels that cannot go through the generic host kernel. The host
// kernel hands the mydev generator to ops with a Generator argument; ops
// without one (native_dropout) would draw from the CPU default generator inside
// their CPU kernel, coupling the two devices' random streams. So dropout is
// composed of device ops that take the generator (queued like any others).
#include "Random.h"

#include <ATen/ops/bernoulli.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

namespace my_device {

std::tuple<at::Tensor, at::Tensor> native_dropout_by_bernoulli(const at::Tensor& input, double p,
                                                               std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (input.numel() == 0 || !train.value_or(true)) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  // Device ops, queued like any: bernoulli.p draws from the device's generator
  // (and traces, for the lazy backend). Scaled in place, as the CPU's kernel
  // scales, so that an integer or bool input is refused at the call as there
  // (its float scale cannot be written back into it), whatever p is.
  const at::Tensor keep = p == 0 ? at::ones_like(input) : p == 1 ? at::zeros_like(input) : at::bernoulli(input, 1 - p);
  at::Tensor output = input.mul(keep).mul_(p == 1 ? 0.0 : 1.0 / (1.0 - p));
  return {std::move(output), keep.to(at::kBool)};
}

namespace {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(native_dropout_by_bernoulli));
}

} // namespace
} // namespace my_device
