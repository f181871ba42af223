// clamp with number bounds, the gradient clipping and value clamping of
// training loops, as a queued structured kernel (StructuredKernel.h).
#include "StructuredKernel.h"

#include <ATen/Dispatch.h>
#include <c10/util/overflows.h>
#include <ATen/native/TensorCompare.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/clamp_native.h>
#include <torch/library.h>

#include <cmath>

namespace my_device {
namespace {

using namespace structured;

const bool g_stubs_mirrored = [] {
  mirror_cpu_stub(at::native::clamp_scalar_stub);
  mirror_cpu_stub(at::native::clamp_max_scalar_stub);
  mirror_cpu_stub(at::native::clamp_min_scalar_stub);
  return true;
}();

// The CPU impl() answers a NaN bound by filling its output with another op,
// which on the stream's worker would be a launch behind the running kernel,
// and checks integer bounds against the dtype's range, which must raise at
// the call: those calls take the host kernel, which runs them as the CPU does.
// A bound the dtype cannot hold (1e5 for half) makes the CPU loop's checked
// conversion raise: also the host kernel's, at the call.
bool queueable(const at::Tensor& self, const std::optional<at::Scalar>& min, const std::optional<at::Scalar>& max) {
  const at::ScalarType dtype = self.scalar_type();
  if (!at::isFloatingType(dtype)) return false;
  auto plain = [&](const std::optional<at::Scalar>& s) {
    if (!s) return true;
    if (s->isComplex() || (s->isFloatingPoint() && std::isnan(s->toDouble()))) return false;
    bool fits = false;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "clamp_bound",
                                    [&] { fits = !c10::overflows<scalar_t, double>(s->toDouble()); });
    return fits;
  };
  return plain(min) && plain(max);
}

at::Tensor clamp(const at::Tensor& self, const std::optional<at::Scalar>& min, const std::optional<at::Scalar>& max) {
  if (!queueable(self, min, max)) return run_host_kernel("aten::clamp", self, min, max)[0].toTensor();
  return functional<at::native::structured_clamp_out>("aten::clamp", self, HeldOptionalScalar(min),
                                                      HeldOptionalScalar(max));
}

at::Tensor& clamp_(at::Tensor& self, const std::optional<at::Scalar>& min, const std::optional<at::Scalar>& max) {
  if (!queueable(self, min, max)) {
    run_host_kernel("aten::clamp_", self, min, max);
    return self;
  }
  return in_place<at::native::structured_clamp_out>("aten::clamp_", self, HeldOptionalScalar(min),
                                                    HeldOptionalScalar(max));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("clamp", TORCH_FN(clamp));
  m.impl("clamp_", TORCH_FN(clamp_));
}

} // namespace
} // namespace my_device
