// add, sub, mul, div and pow of a tensor by a number without the host
// kernel's boxing and aliasing.
//
// These dominate small-tensor workloads (optimizer steps, elementwise glue,
// GELU's cube in GPT-2's MLP), where host-kernel overhead would be most of the
// op's time, so they run as queued structured kernels (StructuredKernel.h).
#include "StructuredKernel.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ScalarOps.h>
#include <c10/util/MaybeOwned.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/Pow.h>
#include <ATen/ops/add.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/div.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/pow_native.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <torch/library.h>

namespace my_device {
namespace {

using namespace structured;

const bool g_stubs_mirrored = [] {
  mirror_cpu_stub(at::native::add_stub);
  mirror_cpu_stub(at::native::mul_stub);
  mirror_cpu_stub(at::native::div_true_stub);
  mirror_cpu_stub(at::native::pow_tensor_scalar_stub);
  return true;
}();

// A wrapped number's value, read by the CPU's own kernel without dispatching
// aten::item (1-2 us, for every `tensor * python_number` a decoding step or an
// optimizer makes).
at::Scalar wrapped_value(const at::Tensor& number) {
  return at::native::_local_scalar_dense_cpu(number);
}

// Whether a wrapped integer number keeps its value in integral `type`. The CPU
// iterator casts one that does not, wrapping around (uint8 + 1000), where a
// Scalar conversion would raise; so such a number is left to that cast.
bool fits_exactly(const at::Tensor& number, at::ScalarType type) {
  if (!at::isIntegralType(type, /*includeBool=*/false) || !at::isIntegralType(number.scalar_type(), false)) {
    return true;
  }
  const int64_t v = wrapped_value(number).toLong();
  bool fits = true;
  AT_DISPATCH_INTEGRAL_TYPES(type, "fits_exactly", [&] { fits = !c10::overflows<scalar_t, int64_t>(v); });
  return fits;
}

// `tensor op python_number` arrives with the number as a 0-dim CPU double or
// int64 "wrapped number". When type promotion keeps the tensor's dtype (the
// usual case: float tensor times 0.5), converting the number first is exactly
// what the CPU iterator would do, and keeps the op on the queued path. Other
// calls (every tensor-tensor one) borrow `other`: no reference count taken and
// dropped per op.
c10::MaybeOwned<at::Tensor> match_wrapped_scalar(const at::Tensor& self, const at::Tensor& other) {
  if (other.dim() != 0 || !other.unsafeGetTensorImpl()->is_wrapped_number() || other.is_same(self)) {
    return c10::MaybeOwned<at::Tensor>::borrowed(other);
  }
  // (A bool stays: sub's check rejects it by its dtype, which converting would hide.)
  const auto common = at::result_type(self, other);
  if (common != self.scalar_type() || other.scalar_type() == common || other.scalar_type() == at::kBool) {
    return c10::MaybeOwned<at::Tensor>::borrowed(other);
  }
  // Half and bfloat16 loops compute in float and read the number as a float:
  // rounding it to the tensor's dtype first would change results (3.14 is
  // 3.140625 in half). Those calls take the host path, which keeps the CPU's
  // numerics, as do the unsigned types that have no op-math type.
  if (c10::isBarebonesUnsignedType(common) || at::toOpMathType(common) != common || !fits_exactly(other, common)) {
    return c10::MaybeOwned<at::Tensor>::borrowed(other);
  }
  at::Tensor converted = at::detail::scalar_tensor_static(wrapped_value(other), common, at::kCPU);
  converted.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c10::MaybeOwned<at::Tensor>::owned(std::move(converted));
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return functional<at::native::structured_ufunc_add_CPU>("aten::add.Tensor", self,
                                                          *match_wrapped_scalar(self, other), alpha);
}

at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return in_place<at::native::structured_ufunc_add_CPU>("aten::add_.Tensor", self,
                                                        *match_wrapped_scalar(self, other), alpha);
}

at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return functional<at::native::structured_sub_out>("aten::sub.Tensor", self,
                                                    *match_wrapped_scalar(self, other), alpha);
}

at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return in_place<at::native::structured_sub_out>("aten::sub_.Tensor", self,
                                                  *match_wrapped_scalar(self, other), alpha);
}

at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  return functional<at::native::structured_mul_out>("aten::mul.Tensor", self,
                                                    *match_wrapped_scalar(self, other));
}

at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) {
  return in_place<at::native::structured_mul_out>("aten::mul_.Tensor", self,
                                                  *match_wrapped_scalar(self, other));
}

at::Tensor div(const at::Tensor& self, const at::Tensor& other) {
  return functional<at::native::structured_div_out>("aten::div.Tensor", self,
                                                    *match_wrapped_scalar(self, other));
}

at::Tensor& div_(at::Tensor& self, const at::Tensor& other) {
  return in_place<at::native::structured_div_out>("aten::div_.Tensor", self,
                                                  *match_wrapped_scalar(self, other));
}

// The CPU's impl() answers exponents 0 and 1 with fill_ and copy_ of its
// output, device ops of their own; and a base of another dtype than the result
// (an integer tensor to a float power) makes its iterator own a converted copy.
// Those calls take the host kernel.
at::Tensor pow_tensor_scalar(const at::Tensor& self, const at::Scalar& exponent) {
  if (exponent.equal(0.0) || exponent.equal(1.0) || exponent.equal(false) || exponent.equal(true) ||
      at::result_type(self, exponent) != self.scalar_type()) {
    return run_host_kernel("aten::pow.Tensor_Scalar", self, exponent)[0].toTensor();
  }
  return functional<at::native::structured_pow_Tensor_Scalar_out>("aten::pow.Tensor_Scalar", self, exponent);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("pow.Tensor_Scalar", TORCH_FN(pow_tensor_scalar));
  m.impl("add.Tensor", TORCH_FN(add));
  m.impl("add_.Tensor", TORCH_FN(add_));
  m.impl("sub.Tensor", TORCH_FN(sub));
  m.impl("sub_.Tensor", TORCH_FN(sub_));
  m.impl("mul.Tensor", TORCH_FN(mul));
  m.impl("mul_.Tensor", TORCH_FN(mul_));
  m.impl("div.Tensor", TORCH_FN(div));
  m.impl("div_.Tensor", TORCH_FN(div_));
}

} // namespace
} // namespace my_device
