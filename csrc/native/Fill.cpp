// Filling: zero_ and fill_.
//
// zeros, zeros_like and new_zeros are empty + zero_, and autograd and the
// optimizers zero buffers on every step. As a host kernel, zero_ paid the
// generic path (plan, call key, Meta cache, boxed CPU call) for what is a
// memset of the tensor's bytes when they are dense: so a dense zero fill is
// one memset kernel. ones_like, full and backward()'s seed gradient are
// fill_ with another value: a short one on an idle stream runs at the call,
// the CPU's fill loop over the tensor's own elements. Queued, it made the
// stream busy for a kernel of one element, and every short op after it in a
// training step's backward queued behind it too. Longer fills and
// fills on a busy stream stay host kernels.
#include "StructuredKernel.h"  // first: DispatchStub's declarations

#include <ATen/Dispatch_v2.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Fill.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "core/KernelArgs.h"
#include "core/Launch.h"
#include "core/TensorImpl.h"
#include "hostkernel/HostKernel.h"

namespace my_device {
namespace {

// A dense tensor's elements fill [data_ptr, data_ptr + nbytes) exactly (strides are never negative).
bool memset_fills(const at::Tensor& self) {
  return self.device().type() == kMyDev && self.layout() == c10::kStrided && !self.is_neg() && !self.is_conj() &&
         self.is_non_overlapping_and_dense();
}

// Runs `body` over `self`'s dense elements. A short one runs at the call on an
// idle stream, or inside the kernel it is nested in (the CPU's sum zeroes its
// output first): no task, no reference held. Queued, it cost a short sum a
// task, a lease and a second launch.
template <class Body>
void over_dense_elements(const at::Tensor& self, const char* label, Body body) {
  const c10::DeviceIndex device = self.device().index();
  const bool short_kernel = is_short_kernel(self.numel());
  if (short_kernel && launch_if_idle(device, label, body)) return;
  KernelArgs held(device);
  launch_async(device, label, [body, keep = held.keep(self.storage())] { body(); }, short_kernel, &held);
}

void memset_zero(const at::Tensor& self) {
  const size_t nbytes = static_cast<size_t>(self.numel()) * self.element_size();
  if (nbytes == 0) return;
  void* data = self.data_ptr();
  over_dense_elements(self, "aten::zero_", [data, nbytes] { std::memset(kernel_address(data), 0, nbytes); });
}

// A dense fill with any value: the value converted at the call (raising as
// the CPU's fill does for one the dtype cannot hold), then each element set.
// It needs no host kernel, whose first call of a signature runs at the call:
// a capture must not depend on whether the warm-up's fill found the stream
// idle (backward's ones_like was refused in a capture after a warm-up that had
// filled at the call). False for a dtype it does not handle.
bool fill_dense(const at::Tensor& self, const at::Scalar& value) {
  switch (self.scalar_type()) {
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong: case at::kBool:
    case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble: case at::kComplexFloat:
    case at::kComplexDouble:
      break;
    default:
      return false;
  }
  AT_DISPATCH_V2(self.scalar_type(), "fill_", AT_WRAP([&] {
    const scalar_t converted = value.to<scalar_t>();
    const int64_t n = self.numel();
    if (n == 0) return;
    void* data = self.data_ptr();
    over_dense_elements(self, "aten::fill_", [data, n, converted] {
      std::fill_n(static_cast<scalar_t*>(kernel_address(data)), n, converted);
    });
  }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kBool, at::kHalf, at::kBFloat16);
  return true;
}

// The CPU's fill_ (fill_out) over `self` at its kernel addresses, if it is
// short and its stream idle (or this is nested in a kernel run at the call).
// Conjugate and negative views are left to the host kernel, whose CPU call
// resolves those bits. False if it did not run.
bool fill_at_call(at::Tensor& self, const at::Scalar& value) {
  if (self.layout() != c10::kStrided || self.is_conj() || self.is_neg() || self.is_quantized() ||
      value.isSymbolic() || !is_short_kernel(self.numel())) {
    return false;
  }
  const c10::DeviceIndex device = self.device().index();
  if (!stream_idle(device)) return false;
  at::TensorIterator iter = at::TensorIteratorConfig()
                                .set_check_mem_overlap(false)  // as the CPU's: a fill may write an expanded view
                                .check_all_same_dtype(false)
                                .add_output(self)
                                .resize_outputs(false)
                                .build();
  // A value the dtype cannot hold fails before anything is written, and the
  // CPU raises that at the call: so does this, rather than at the next
  // synchronisation as a kernel failure.
  std::exception_ptr error;
  const bool ran = launch_if_idle(device, "aten::fill_", [&]() MYDEV_INLINE_BODY {
    try {
      structured::use_kernel_addresses(iter);
      at::native::fill_stub(c10::DeviceType::CPU, iter, value);
    } catch (...) {
      error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
  return ran;
}

at::Tensor& host_kernel_call(const char* label, at::Tensor& self, std::optional<c10::IValue> value) {
  torch::jit::Stack stack{self};
  if (value) stack.push_back(*value);
  host_kernel(op_named(label), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  return self;
}

at::Tensor& zero_(at::Tensor& self) {
  if (!memset_fills(self)) {
    if (fill_at_call(self, 0)) return self;
    return host_kernel_call("aten::zero_", self, std::nullopt);
  }
  memset_zero(self);
  return self;
}

// All bytes zero: +0 (not -0.0, whose sign bit is set), false, 0j.
bool is_all_zero_bits(const at::Scalar& value) {
  if (value.isBoolean()) return !value.toBool();
  // (An unsigned 64-bit value may not fit toLong: uint64's maximum.)
  if (value.isIntegral(/*includeBool=*/false)) return value.isUnsigned() ? value.toUInt64() == 0 : value.toLong() == 0;
  if (value.isFloatingPoint()) return value.toDouble() == 0.0 && !std::signbit(value.toDouble());
  if (value.isComplex()) {
    const auto z = value.toComplexDouble();
    return z == c10::complex<double>(0, 0) && !std::signbit(z.real()) && !std::signbit(z.imag());
  }
  return false;
}

at::Tensor& fill_(at::Tensor& self, const at::Scalar& value) {
  if (memset_fills(self) && !value.isSymbolic() && !self.is_quantized()) {
    if (is_all_zero_bits(value)) {
      memset_zero(self);
      return self;
    }
    if (fill_dense(self, value)) return self;
  }
  if (fill_at_call(self, value)) return self;
  return host_kernel_call("aten::fill_.Scalar", self, c10::IValue(value));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("zero_", TORCH_FN(zero_));
  m.impl("fill_.Scalar", TORCH_FN(fill_));
}

} // namespace
} // namespace my_device
