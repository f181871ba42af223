// clamp with number bounds, the gradient clipping and value clamping of
// training loops, where(condition, self, other), the masking of attention
// and of losses, and the comparisons (eq, ne, lt, le, gt, ge) that build those
// masks, as queued structured kernels (StructuredKernel.h).
#include "StructuredKernel.h"

#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ScalarOps.h>
#include <c10/util/TypeCast.h>
#include <c10/util/overflows.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/TensorCompare.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/clamp_native.h>
#include <ATen/ops/eq_native.h>
#include <ATen/ops/ge_native.h>
#include <ATen/ops/gt_native.h>
#include <ATen/ops/le_native.h>
#include <ATen/ops/lt_native.h>
#include <ATen/ops/ne_native.h>
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
  mirror_cpu_stub(at::native::eq_stub);
  mirror_cpu_stub(at::native::ne_stub);
  mirror_cpu_stub(at::native::lt_stub);
  mirror_cpu_stub(at::native::le_stub);
  mirror_cpu_stub(at::native::gt_stub);
  mirror_cpu_stub(at::native::ge_stub);
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

// The comparisons' structured kernels, used as they are. Each derives from
// its at::native class only to give its calls an overload of uniform_dtype
// (below), found by argument-dependent lookup in this namespace.
struct EqIterator : at::native::structured_eq_Tensor_out {};
struct NeIterator : at::native::structured_ne_Tensor_out {};
struct LtIterator : at::native::structured_lt_Tensor_out {};
struct LeIterator : at::native::structured_le_Tensor_out {};
struct GtIterator : at::native::structured_gt_Tensor_out {};
struct GeIterator : at::native::structured_ge_Tensor_out {};

// A functional comparison's output is bool whatever its inputs' dtype, and
// CPU's comparison loops (cpu/BinaryOpsKernel.cpp), for a bool output, read
// both inputs as the common dtype: calls whose inputs already have it can take
// them. (Mixed dtypes take the host kernel, which casts as the CPU does.)
template <class Iterator>
bool comparison_inputs_uniform(const Iterator& iter) {
  return iter.dtype(0) == at::kBool && iter.input_dtype(0) == iter.common_dtype() &&
         iter.input_dtype(1) == iter.common_dtype();
}
bool uniform_dtype(const EqIterator& iter) { return comparison_inputs_uniform(iter); }
bool uniform_dtype(const NeIterator& iter) { return comparison_inputs_uniform(iter); }
bool uniform_dtype(const LtIterator& iter) { return comparison_inputs_uniform(iter); }
bool uniform_dtype(const LeIterator& iter) { return comparison_inputs_uniform(iter); }
bool uniform_dtype(const GtIterator& iter) { return comparison_inputs_uniform(iter); }
bool uniform_dtype(const GeIterator& iter) { return comparison_inputs_uniform(iter); }

// The dtypes all six CPU loops have (complex: eq and ne only; others raise in
// the loop, which must happen at the call: the host kernel's).
bool comparison_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBool: case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble:
      return true;
    default:
      return false;
  }
}

int category(at::ScalarType dtype) {
  if (dtype == at::kBool) return 0;
  if (at::isIntegralType(dtype, /*includeBool=*/false)) return 1;
  return at::isFloatingType(dtype) ? 2 : 3;
}

// `tensor < number` wraps the number as a 0-d CPU tensor of int64, double or
// bool, whose dtype is not the tensor's. When the number does not promote the
// tensor (its kind, bool < integer < floating, is no higher than the
// tensor's), CPU's TensorIterator casts it to the tensor's dtype before the
// loop, a plain static_cast (c10::convert, what its copy kernel does: 1000
// becomes -24 for int8, 1e300 inf for float, 3.14 3.140625 for half). The
// number is converted here the same way, so that the call needs no cast and
// can take the kernel; otherwise (int tensor < 0.5: compared in the default
// float dtype) nullopt, and the call takes the host kernel.
std::optional<at::Tensor> number_as(const at::Scalar& number, at::ScalarType dtype) {
  if (number.isSymbolic() || !comparison_dtype(dtype)) return std::nullopt;
  const at::ScalarType kind = number.type();
  if (kind != at::kDouble && kind != at::kLong && kind != at::kBool) return std::nullopt;
  if (category(kind) > category(dtype)) return std::nullopt;
  at::Tensor t = at::detail::empty_cpu({}, dtype, /*pin_memory=*/false, std::nullopt);
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, dtype, "comparison_number", [&] {
    scalar_t* out = t.mutable_data_ptr<scalar_t>();
    if (kind == at::kDouble) {
      *out = c10::convert<scalar_t>(number.toDouble());
    } else if (kind == at::kLong) {
      *out = c10::convert<scalar_t>(number.toLong());
    } else {
      *out = c10::convert<scalar_t>(number.toBool());
    }
  });
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

bool plain(const at::Tensor& t) {
  return t.layout() == c10::kStrided && (t.device().type() == kMyDev || t.device().is_cpu());
}

// Calls the kernel takes: strided operands of a dtype every comparison loop
// has (meta() then rejects devices as TensorIterator does: a CPU operand must
// be a 0-d scalar).
template <class Iterator>
at::Tensor compare_tensor(const char* label, const at::Tensor& self, const at::Tensor& other) {
  if (!plain(self) || !plain(other) || !comparison_dtype(self.scalar_type()) ||
      !comparison_dtype(other.scalar_type())) {
    return run_host_kernel(label, self, other)[0].toTensor();
  }
  return functional<Iterator>(label, self, other);
}

template <class Iterator>
at::Tensor compare_scalar(const char* tensor_label, const char* label, const at::Tensor& self,
                          const at::Scalar& other) {
  if (plain(self)) {
    if (auto converted = number_as(other, self.scalar_type())) {
      return functional<Iterator>(tensor_label, self, *converted);
    }
  }
  // The host kernel queues a call once its tensors' dtypes are known to have
  // CPU kernels (QueuedHostKernel.cpp); a number is no tensor there, so
  // `int_tensor > 1j`, compared as complex, where the CPU loop raises, would
  // be queued and raise late. As a wrapped number (what CPU's gt.Scalar makes
  // of it), its dtype counts: a complex call stays at the call.
  if (!other.isSymbolic()) {
    return run_host_kernel(tensor_label, self, at::native::wrapped_scalar_tensor(other))[0].toTensor();
  }
  return run_host_kernel(label, self, other)[0].toTensor();
}

#define MYDEV_COMPARISON(name, Iterator)                                                            \
  at::Tensor name##_tensor(const at::Tensor& self, const at::Tensor& other) {                       \
    return compare_tensor<Iterator>("aten::" #name ".Tensor", self, other);                         \
  }                                                                                                 \
  at::Tensor name##_scalar(const at::Tensor& self, const at::Scalar& other) {                       \
    return compare_scalar<Iterator>("aten::" #name ".Tensor", "aten::" #name ".Scalar", self, other); \
  }
MYDEV_COMPARISON(eq, EqIterator)
MYDEV_COMPARISON(ne, NeIterator)
MYDEV_COMPARISON(lt, LtIterator)
MYDEV_COMPARISON(le, LeIterator)
MYDEV_COMPARISON(gt, GtIterator)
MYDEV_COMPARISON(ge, GeIterator)
#undef MYDEV_COMPARISON

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("clamp", TORCH_FN(clamp));
  m.impl("clamp_", TORCH_FN(clamp_));
  m.impl("where.self", TORCH_FN(where_self));
  m.impl("eq.Tensor", TORCH_FN(eq_tensor));
  m.impl("eq.Scalar", TORCH_FN(eq_scalar));
  m.impl("ne.Tensor", TORCH_FN(ne_tensor));
  m.impl("ne.Scalar", TORCH_FN(ne_scalar));
  m.impl("lt.Tensor", TORCH_FN(lt_tensor));
  m.impl("lt.Scalar", TORCH_FN(lt_scalar));
  m.impl("le.Tensor", TORCH_FN(le_tensor));
  m.impl("le.Scalar", TORCH_FN(le_scalar));
  m.impl("gt.Tensor", TORCH_FN(gt_tensor));
  m.impl("gt.Scalar", TORCH_FN(gt_scalar));
  m.impl("ge.Tensor", TORCH_FN(ge_tensor));
  m.impl("ge.Scalar", TORCH_FN(ge_scalar));
}

} // namespace
} // namespace my_device
