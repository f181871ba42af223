// sum over dimensions (losses, bias gradients, normalisations) and argmax and
// argmin (greedy decoding, accuracy) as queued structured kernels
// (StructuredKernel.h). A reduction's impl() builds its own
// TensorIterator: queued, it runs on host aliases of the device tensors.
#include "StructuredKernel.h"

#include <ATen/native/ReduceOps.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/argmax_native.h>
#include <ATen/ops/argmin.h>
#include <ATen/ops/argmin_native.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/sum_native.h>
#include <torch/library.h>

namespace my_device::structured {
// Run at the call, its TensorIterator is over the device tensors: it calls
// sum_stub with their device type (mirrored below) and zeroes or fills its
// output with ops. A reduced float sum takes an extra-precision path on the
// CPU only (should_use_acc_buffer asks for a CPU iterator): host aliases.
template <>
struct RunsOnDeviceTensors<at::native::structured_sum_out> : OnDeviceTensors {
  static bool accepts(const at::Tensor& self, const HeldIntList&, bool, const std::optional<at::ScalarType>& dtype) {
    return !at::isReducedFloatingType(self.scalar_type()) && !(dtype && at::isReducedFloatingType(*dtype));
  }
};
// Their impl()s fill a dim of size 1 with fill_(), build a reduction over the
// device tensors and call argmax_stub/argmin_stub with its device type (mirrored below).
template <>
struct RunsOnDeviceTensors<at::native::structured_argmax_out> : OnDeviceTensors {};
template <>
struct RunsOnDeviceTensors<at::native::structured_argmin_out> : OnDeviceTensors {};
} // namespace my_device::structured

namespace my_device {
namespace {

using namespace structured;

const bool g_stubs_mirrored = [] {
  mirror_cpu_stub(at::native::sum_stub);
  mirror_cpu_stub(at::native::argmax_stub);
  mirror_cpu_stub(at::native::argmin_stub);
  return true;
}();

// Real dtypes only: the CPU kernel's dtype errors (ComplexHalf, float8) and
// its complex-to-real cast warning must come at the call, from the host kernel.
bool queueable(at::ScalarType t) {
  return at::isFloatingType(t) || at::isIntegralType(t, /*includeBool=*/true);
}

at::Tensor sum(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
               std::optional<at::ScalarType> dtype) {
  if (!queueable(self.scalar_type()) || (dtype && !queueable(*dtype)) ||
      (at::isFloatingType(self.scalar_type()) && dtype && !at::isFloatingType(*dtype))) {
    return run_host_kernel("aten::sum.dim_IntList", self, dim, keepdim, dtype)[0].toTensor();
  }
  return functional<at::native::structured_sum_out>("aten::sum.dim_IntList", self, HeldIntList(dim), keepdim, dtype);
}

// Every dtype: the first call of each runs at the call, so a dtype the CPU
// loop lacks (complex) raises there.
at::Tensor argmax(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  return functional<at::native::structured_argmax_out>("aten::argmax", self, dim, keepdim);
}

at::Tensor argmin(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  return functional<at::native::structured_argmin_out>("aten::argmin", self, dim, keepdim);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("sum.dim_IntList", TORCH_FN(sum));
  m.impl("argmax", TORCH_FN(argmax));
  m.impl("argmin", TORCH_FN(argmin));
}

} // namespace
} // namespace my_device
