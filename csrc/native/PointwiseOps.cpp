// lerp, addcmul and addcdiv on single tensors as queued structured kernels
// (StructuredKernel.h): the per-parameter updates of optimizers run without
// foreach (and CPU-style training loops written by hand). The foreach forms
// are in ForeachOps.cpp.
#include "StructuredKernel.h"

#include <ATen/native/Lerp.h>
#include <ATen/native/PointwiseOps.h>
#include <ATen/ops/addcdiv_native.h>
#include <ATen/ops/addcmul_native.h>
#include <ATen/ops/lerp_native.h>
#include <torch/library.h>

namespace my_device {
namespace {

using namespace structured;

const bool g_stubs_mirrored = [] {
  mirror_cpu_stub(at::native::lerp_kernel_scalar_weight);
  mirror_cpu_stub(at::native::lerp_kernel_tensor_weight);
  mirror_cpu_stub(at::native::addcmul_stub);
  mirror_cpu_stub(at::native::addcdiv_stub);
  return true;
}();

// The loops read their number operand converted to the tensor's dtype, which
// raises for an out-of-range or complex number only when they run: float and
// double tensors take the queued path with the number checked at the call
// (check_number_converts); other dtypes go to the host kernel, which raises at the call.
bool queueable(const at::Tensor& self, const at::Scalar& number) {
  const auto dtype = self.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) return false;
  check_number_converts(number, dtype);
  return true;
}

at::Tensor lerp_scalar(const at::Tensor& self, const at::Tensor& end, const at::Scalar& weight) {
  if (!queueable(self, weight)) return run_host_kernel("aten::lerp.Scalar", self, end, weight)[0].toTensor();
  return functional<at::native::structured_lerp_Scalar>("aten::lerp.Scalar", self, end, weight);
}

at::Tensor& lerp_scalar_(at::Tensor& self, const at::Tensor& end, const at::Scalar& weight) {
  if (!queueable(self, weight)) {
    run_host_kernel("aten::lerp_.Scalar", self, end, weight);
    return self;
  }
  return in_place<at::native::structured_lerp_Scalar>("aten::lerp_.Scalar", self, end, weight);
}

at::Tensor lerp_tensor(const at::Tensor& self, const at::Tensor& end, const at::Tensor& weight) {
  return functional<at::native::structured_lerp_Tensor>("aten::lerp.Tensor", self, end, weight);
}

at::Tensor& lerp_tensor_(at::Tensor& self, const at::Tensor& end, const at::Tensor& weight) {
  return in_place<at::native::structured_lerp_Tensor>("aten::lerp_.Tensor", self, end, weight);
}

template <class Base>
at::Tensor pointwise(const char* label, const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                     const at::Scalar& value) {
  if (!queueable(self, value)) return run_host_kernel(label, self, t1, t2, value)[0].toTensor();
  return functional<Base>(label, self, t1, t2, value);
}

template <class Base>
at::Tensor& pointwise_(const char* label, at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                       const at::Scalar& value) {
  if (!queueable(self, value)) {
    run_host_kernel(label, self, t1, t2, value);
    return self;
  }
  return in_place<Base>(label, self, t1, t2, value);
}

at::Tensor addcmul(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value) {
  return pointwise<at::native::structured_addcmul_out>("aten::addcmul", self, t1, t2, value);
}

at::Tensor& addcmul_(at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value) {
  return pointwise_<at::native::structured_addcmul_out>("aten::addcmul_", self, t1, t2, value);
}

at::Tensor addcdiv(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value) {
  return pointwise<at::native::structured_addcdiv_out>("aten::addcdiv", self, t1, t2, value);
}

at::Tensor& addcdiv_(at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value) {
  return pointwise_<at::native::structured_addcdiv_out>("aten::addcdiv_", self, t1, t2, value);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("lerp.Scalar", TORCH_FN(lerp_scalar));
  m.impl("lerp_.Scalar", TORCH_FN(lerp_scalar_));
  m.impl("lerp.Tensor", TORCH_FN(lerp_tensor));
  m.impl("lerp_.Tensor", TORCH_FN(lerp_tensor_));
  m.impl("addcmul", TORCH_FN(addcmul));
  m.impl("addcmul_", TORCH_FN(addcmul_));
  m.impl("addcdiv", TORCH_FN(addcdiv));
  m.impl("addcdiv_", TORCH_FN(addcdiv_));
}

} // namespace
} // namespace my_device
