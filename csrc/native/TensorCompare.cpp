// clamp with number bounds, the gradient clipping and value clamping of
// training loops, and where(condition, self, other), the masking of attention
// and of losses, as queued structured kernels (StructuredKernel.h).
#include "StructuredKernel.h"

#include <ATen/Dispatch.h>
#include <c10/util/overflows.h>
#include <ATen/native/TensorCompare.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/clamp_native.h>
#include <torch/library.h>

#include <cmath>
#include <type_traits>

namespace my_device {
namespace {

using namespace structured;

const bool g_stubs_mirrored = [] {
  mirror_cpu_stub(at::native::clamp_scalar_stub);
  mirror_cpu_stub(at::native::clamp_max_scalar_stub);
  mirror_cpu_stub(at::native::clamp_min_scalar_stub);
  mirror_cpu_stub(at::native::where_kernel);
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

// where.self has no structured kernel in PyTorch: CPU's where_self_out
// converts self and other to their result type, moves CPU scalars to the
// device, then builds a TensorIterator over (out, condition, self, other) and
// calls where_kernel. This is that iterator, as a structured kernel's
// meta()/impl() pair, for the calls that need none of those conversions (see
// where_self); the output takes self's dtype, the condition stays bool.
struct WhereIterator : at::TensorIteratorBase {
  void meta(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
    at::TensorIteratorConfig config;
    config.check_all_same_dtype(false)
        .declare_static_dtype(self.scalar_type())
        .add_output(maybe_get_output(0))
        .add_const_input(condition)
        .add_const_input(self)
        .add_const_input(other);
    build(config);
  }
  void impl(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
    // where_kernel takes an at::TensorIterator, a final class, where the other
    // stubs take a TensorIteratorBase; TensorIterator adds no state to its
    // base, and converting from it is its documented use ("slicing is OK").
    at::TensorIterator iter(*this);
    at::native::where_kernel(at::kPrivateUse1, iter);
  }
};
// Fails to compile once where_kernel takes a TensorIteratorBase: impl() can then pass *this.
static_assert(std::is_same_v<at::native::where_fn, void (*)(at::TensorIterator&)>,
              "where_kernel's signature changed: pass the WhereIterator itself");

// The structured machinery's uniform_dtype() sends a call to the host kernel
// unless every operand has the common dtype, as CPU loops expect of most ops.
// where's loop expects a bool condition beside operands of the output's dtype,
// and TensorIterator's common dtype is then only the first input's (bool).
// This overload, more specific for WhereIterator, is found by argument-
// dependent lookup from StructuredKernel.h's unqualified call. (A hook of
// StructuredKernel.h's own would say this better; that file is not this one's.)
bool uniform_dtype(const WhereIterator& iter) {
  return iter.input_dtype(0) == at::kBool && iter.input_dtype(1) == iter.dtype(0) &&
         iter.input_dtype(2) == iter.dtype(0);
}

// Calls the kernel takes: three mydev tensors, a bool condition, self and
// other of one dtype. The others (a uint8 condition, which CPU's where accepts
// with a deprecation warning; a condition of another dtype, which it rejects;
// mixed dtypes, promoted; CPU scalars) take the host kernel, which runs CPU's
// where_self_out: same conversions, warnings and errors.
bool where_kernel_takes(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  for (const at::Tensor* t : {&condition, &self, &other}) {
    if (t->device().type() != kMyDev || t->layout() != c10::kStrided) return false;
  }
  return condition.scalar_type() == at::kBool && self.scalar_type() == other.scalar_type();
}

at::Tensor where_self(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  if (!where_kernel_takes(condition, self, other)) {
    return run_host_kernel("aten::where.self", condition, self, other)[0].toTensor();
  }
  return functional<WhereIterator>("aten::where.self", condition, self, other);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("clamp", TORCH_FN(clamp));
  m.impl("clamp_", TORCH_FN(clamp_));
  m.impl("where.self", TORCH_FN(where_self));
}

} // namespace
} // namespace my_device
