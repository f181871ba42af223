// sum over dimensions (losses, bias gradients, normalisations) as a queued
// structured kernel (StructuredKernel.h). A reduction's impl() builds its own
// TensorIterator, so it runs on host aliases of the device tensors.
#include "StructuredKernel.h"

#include <ATen/ops/sum.h>
#include <ATen/ops/sum_native.h>
#include <torch/library.h>

namespace my_device {
namespace {

using namespace structured;

at::Tensor sum(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
               std::optional<at::ScalarType> dtype) {
  return functional<at::native::structured_sum_out>("aten::sum.dim_IntList", self, HeldIntList(dim), keepdim, dtype);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("sum.dim_IntList", TORCH_FN(sum));
}

} // namespace
} // namespace my_device
