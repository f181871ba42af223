#pragma once
// Structured CPU kernels run directly on mydev tensors, queued on the stream.
//
// PyTorch's structured kernels split an op into meta() (shapes, dtypes, device
// checks, type promotion; output allocation through set_output_*) and impl()
// (the loop). Here meta() runs at the call, over the device tensors, and impl()
// is queued with launch_async; impl() reaches the loop through the op's
// DispatchStub, whose PrivateUse1 slot mirror_cpu_stub fills with the CPU loop.
// A vendor plugs in device loops by registering theirs in that slot instead.
// Op families using this: BinaryOps.cpp, UnaryOps.cpp, SoftMax.cpp, LinearAlgebra.cpp,
// ReduceOps.cpp, TensorCompare.cpp.

// The wheel's libtorch_cpu is built with these CPU-capability kernels, and the
// DispatchStub header only declares the matching members when they are defined.
#if defined(__x86_64__)
#define HAVE_AVX2_CPU_DEFINITION
#define HAVE_AVX512_CPU_DEFINITION
#endif

#include <ATen/TensorIterator.h>
#include <ATen/Version.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/native/DispatchStub.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

#include "Factory.h"
#include "hostkernel/HostKernel.h"
#include "core/JobPool.h"
#include "core/KernelArgs.h"
#include "core/Launch.h"
#include "core/TensorImpl.h"

namespace my_device::structured {

// Copies the CPU kernel a stub would pick on this machine into its PrivateUse1 slot.
template <class Stub>
void mirror_cpu_stub(Stub& stub) {
  using FnPtr = typename Stub::FnPtr;
  FnPtr chosen = Stub::DEFAULT;
#if defined(__x86_64__)
  // at::get_cpu_capability() honours ATEN_CPU_CAPABILITY, as the CPU path does.
  const std::string capability = at::get_cpu_capability();
  if (capability == "AVX512" && Stub::AVX512 != nullptr) {
    chosen = Stub::AVX512;
  } else if ((capability == "AVX512" || capability == "AVX2") && Stub::AVX2 != nullptr) {
    chosen = Stub::AVX2;
  }
#endif
  stub.set_privateuse1_dispatch_ptr(chosen);
}

// Structured kernels built on TensorIterator (pointwise, reductions) keep
// their operands in the iterator; the others (mm, softmax) only see outputs.
template <class Base>
constexpr bool kIterator = std::is_base_of_v<at::TensorIteratorBase, Base>;

// A structured kernel whose output is a new mydev tensor. The output is shared
// with the caller while the queued kernel runs, so it is a plain Tensor (an
// ExclusivelyOwned one would be destroyed regardless of the caller's reference).
template <class Base>
struct Functional final : Base {
  void set_output_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options) override {
    output = empty_device(sizes, strides, options);
    if constexpr (kIterator<Base>) Base::set_output_raw_strided(idx, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    output = empty_device(sizes, strides, options);
    if constexpr (kIterator<Base>) Base::set_output_raw_strided(idx, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t) override {
    return output;
  }
  at::Tensor output;
};

// A structured kernel writing into `self`, with the checks PyTorch's in-place wrappers make.
template <class Base>
struct InPlace final : Base {
  explicit InPlace(const at::Tensor& self) : self(&self) {}
  // Points the op at the job's own reference to the tensor.
  void rebind(const at::Tensor& owned) {
    self = &owned;
  }
  void check(c10::IntArrayRef sizes, const c10::TensorOptions& options) {
    TORCH_CHECK(options.dtype() == self->dtype(), "Bad in-place call: input tensor dtype ", self->dtype(),
                " and output tensor dtype ", options.dtype(), " should match");
    TORCH_CHECK(options.device() == self->device(), "Bad in-place call: input tensor device ", self->device(),
                " and output tensor device ", options.device(), " should match");
    TORCH_CHECK(sizes == self->sizes(), "Bad in-place call: input tensor size ", self->sizes(),
                " and output tensor size ", sizes, " should match");
  }
  void set_output_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options) override {
    check(sizes, options);
    if constexpr (kIterator<Base>) Base::set_output_raw_strided(idx, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    check(sizes, options);
    if constexpr (kIterator<Base>) Base::set_output_raw_strided(idx, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t) override {
    return *self;
  }
  const at::Tensor* self;
};

// CPU loops assume every operand already has the common dtype: on CPU,
// TensorIterator inserts casts only when the common device is CPU. Mixed-dtype
// calls (int + float, tensor * python float) therefore take the host-kernel
// path, where it does. meta() still ran first, so device errors are the same.
inline bool uniform_dtype(const at::TensorIteratorBase& iter) {
  for (int i = 0; i < iter.ntensors(); ++i) {
    if (iter.dtype(i) != iter.common_dtype()) return false;
  }
  return true;
}

template <class T>
const T& host_arg(HostCall&, const T& value) {
  return value;
}
inline at::Tensor host_arg(HostCall& call, const at::Tensor& t) {
  return call.to_host(t);
}

// Runs the op named `label` ("aten::add.Tensor") as a host kernel
// (HostKernel.cpp) and returns its results: for calls the structured path
// cannot take. Mixed dtypes: the CPU loops here assume one dtype, while the
// host kernel's CPU operator casts as the CPU does. Dtypes a CPU kernel may
// lack (integer matrix products): the host kernel runs the first such call at
// the call, so an unsupported dtype raises there. Either way the host kernel
// queues the call when it can (QueuedHostKernel.cpp).
// Arguments structured kernels take as views (OptionalScalarRef,
// OptionalIntArrayRef) over the caller's values, which are gone by the time a
// queued impl() runs: the job holds them by value and hands out views of its
// own copy (a job's arguments never move once it is built).
class HeldOptionalScalar {
 public:
  explicit HeldOptionalScalar(const std::optional<at::Scalar>& value) : value_(value) {}
  operator at::OptionalScalarRef() const {
    return value_ ? at::OptionalScalarRef(&*value_) : at::OptionalScalarRef();
  }
  c10::IValue ivalue() const {
    return value_ ? c10::IValue(*value_) : c10::IValue();
  }

 private:
  std::optional<at::Scalar> value_;
};

class HeldIntList {
 public:
  explicit HeldIntList(at::OptionalIntArrayRef value) {
    if (value) value_.emplace(value->begin(), value->end());
  }
  operator at::OptionalIntArrayRef() const {
    return value_ ? at::OptionalIntArrayRef(*value_) : at::OptionalIntArrayRef();
  }
  c10::IValue ivalue() const {
    return value_ ? c10::IValue(*value_) : c10::IValue();
  }

 private:
  std::optional<std::vector<int64_t>> value_;
};

template <class T>
const T& ivalue_of(const T& value) {
  return value;
}
inline c10::IValue ivalue_of(const HeldOptionalScalar& value) {
  return value.ivalue();
}
inline c10::IValue ivalue_of(const HeldIntList& value) {
  return value.ivalue();
}

// A number a loop reads converted to the op's dtype (alpha, weight, value)
// raises there if it is complex or a finite double beyond float's range: on
// the CPU when the loop runs, at the call. A queued loop runs later, so the
// conversion is checked at the call first, with the same error. For float and
// double ops (the loops of other dtypes read the number otherwise).
inline void check_number_converts(const at::Scalar& s, at::ScalarType dtype) {
  if (dtype == at::kFloat) {
    (void)s.to<float>();
  } else {
    (void)s.to<double>();
  }
}

template <class... Args>
torch::jit::Stack run_host_kernel(const char* label, const Args&... args) {
  const c10::OperatorHandle& op = op_named(label);
  TORCH_INTERNAL_ASSERT(op.schema().arguments().size() == sizeof...(Args), label, ": wrong number of arguments");
  torch::jit::Stack stack;
  stack.reserve(sizeof...(Args));
  (stack.emplace_back(ivalue_of(args)), ...);
  host_kernel(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  return stack;
}

// Raises PyTorch's "Expected all tensors to be on the same device" error
// unless the named tensors share a device: TensorIterator checks this itself,
// the other structured kernels rely on their dispatcher wrapper, which this
// replaces (with the same message).
inline void check_same_device(const char* op,
                              std::initializer_list<std::pair<const char*, const at::Tensor&>> tensors) {
  std::optional<c10::Device> common;
  for (const auto& [name, t] : tensors) c10::impl::check_and_update_common_device(common, t, op, name);
}

// The kernel is queued: meta() runs now (shapes, dtypes, device checks,
// output allocation) and impl() runs on the stream's worker. The TensorIterator
// borrows its operands, so the job owns copies of them, and the job lives
// until the kernel has run. `label` names the op's overload, for failure
// reports and for the host kernel that serves mixed-dtype calls.
// A TensorIterator records its operands' data pointers, at their device
// addresses, when it is built; the kernel reaches them at their kernel addresses.
// Outside strict mode the addresses are equal, and rewriting them anyway would
// dirty the job's cache lines on the worker, for the host to fetch back.
inline void use_kernel_addresses(at::TensorIteratorBase& iter) {
  if (!strict_mode()) return;
  for (int i = 0; i < iter.ntensors(); ++i) iter.unsafe_replace_operand(i, kernel_address(iter.data_ptr(i)));
}

// What a queued kernel keeps of an argument (KernelArgs.h). Outside
// TensorIterator, a tensor under a TensorImpl of its own, so that a caller
// restriding it after the launch (t_, resize_) does not change what the kernel
// reads; a TensorIterator records its operands' geometry when it is built, so
// there the caller's TensorImpl is shared (unless the storage is leased):
// giving each input its own TensorImpl measured slower than it saves.
template <class T>
const T& held_arg(KernelArgs&, bool, const T& value) {
  return value;
}
inline at::Tensor held_arg(KernelArgs& held, bool own, const at::Tensor& t) {
  return own ? held.own(t) : held.share(t);
}

// The device a call's kernel will be launched on: that of its first mydev
// tensor (meta() rejects calls mixing devices).
template <class... Args>
c10::DeviceIndex launch_device(const Args&... args) {
  c10::DeviceIndex device = -1;
  auto visit = [&](const auto& a) {
    if constexpr (std::is_same_v<std::decay_t<decltype(a)>, at::Tensor>) {
      if (device < 0 && a.defined() && a.device().type() == kMyDev) device = a.device().index();
    }
  };
  (visit(args), ...);
  return device < 0 ? current_device() : device;
}

// Whether every tensor argument is small enough for a short kernel: calls
// that may run at once (launch_if_idle) are picked before meta() knows the
// output's size.
template <class... Args>
bool short_operands(const Args&... args) {
  auto fits = [](const auto& a) {
    if constexpr (std::is_same_v<std::decay_t<decltype(a)>, at::Tensor>) {
      return !a.defined() || is_short_kernel(a.numel());
    } else {
      return true;
    }
  };
  return (fits(args) && ...);
}

// A short TensorIterator kernel on an idle stream runs at the call, over the
// caller's own tensors, as the CPU runs it: no job holding its arguments, no
// TensorImpl of the kernel's own, no task. Empty if the call must be queued
// (the caller then builds the job; if the stream stopped being idle after
// meta() ran here, meta() runs once more there).
template <class Base, class... Args>
std::optional<at::Tensor> functional_now(const char* label, const Args&... args) {
  const c10::DeviceIndex device = launch_device(args...);
  if (!short_operands(args...) || !stream_idle(device)) return std::nullopt;
  Functional<Base> op;
  op.meta(args...);
  if (!uniform_dtype(op)) return run_host_kernel(label, args...)[0].toTensor();
  if (!is_short_kernel(op.numel())) return std::nullopt;
  TORCH_INTERNAL_ASSERT(op.output.device().index() == device, label, ": output on mydev:",
                        op.output.device().index(), ", inputs on mydev:", device);
  const bool ran = launch_if_idle(device, label, [&] {
    use_kernel_addresses(op);
    op.impl(args..., op.output);
  });
  if (!ran) return std::nullopt;
  return std::move(op.output);
}

template <class Base, class... Args>
at::Tensor functional(const char* label, const Args&... args) {
  if constexpr (kIterator<Base>) {
    if (auto out = functional_now<Base>(label, args...)) return std::move(*out);
  }
  struct Job : Pooled<Job> {
    Job(c10::DeviceIndex device, const Args&... a) : held(device), args(held_arg(held, !kIterator<Base>, a)...) {}
    KernelArgs held;
    std::tuple<Args...> args;
    Functional<Base> op;
  };
  auto job = std::make_unique<Job>(launch_device(args...), args...);
  std::apply([&](const auto&... a) { job->op.meta(a...); }, job->args);
  const c10::DeviceIndex device = job->op.output.device().index();
  if constexpr (kIterator<Base>) {
    if (!uniform_dtype(job->op)) return run_host_kernel(label, args...)[0].toTensor();
  }
  TORCH_INTERNAL_ASSERT(device == job->held.device(), label, ": output on mydev:", device, ", inputs on mydev:",
                        job->held.device());
  // The caller gets its own TensorImpl (kernel_handle): outputs are the tensors
  // most often dropped while their kernel is still queued. The job's is then
  // pointed at a lease, so that dropping it gives the block back at once.
  at::Tensor out = kernel_handle(job->op.output);
  job->held.lease_in_place(job->op.output);
  // A TensorIterator kernel's impl() over a few thousand elements costs less
  // than handing it to the worker (kShortKernelElements). The others map their
  // operands to the host first (HostCall), which costs about as much again.
  bool short_kernel = false;
  if constexpr (kIterator<Base>) short_kernel = is_short_kernel(job->op.numel());
  launch_async(device, label, [job = std::move(job)] {
    if constexpr (kIterator<Base>) {
      use_kernel_addresses(job->op);
      std::apply([&](const auto&... a) { job->op.impl(a..., job->op.output); }, job->args);
    } else {
      // Kernels outside TensorIterator call other ops (addmm copies self into
      // its output with copy_). On device tensors those would be launched onto
      // this stream, behind the running kernel; on host aliases they are CPU ops.
      HostCall call(job->op.output.device().index());
      std::apply([&](const auto&... a) { job->op.impl(host_arg(call, a)..., call.to_host(job->op.output)); },
                 job->args);
    }
  }, short_kernel);
  return out;
}

// in_place's counterpart of functional_now: true if the call is done.
template <class Base, class... Args>
bool in_place_now(const char* label, at::Tensor& self, const Args&... args) {
  const c10::DeviceIndex device = self.device().index();
  if (!short_operands(self, args...) || !stream_idle(device)) return false;
  InPlace<Base> op(self);
  op.meta(self, args...);
  if (!uniform_dtype(op)) {
    run_host_kernel(label, self, args...);
    return true;
  }
  return launch_if_idle(device, label, [&] {
    use_kernel_addresses(op);
    op.impl(self, args..., self);
  });
}

template <class Base, class... Args>
at::Tensor& in_place(const char* label, at::Tensor& self, const Args&... args) {
  // impl() runs on the device tensors themselves: only a TensorIterator
  // (use_kernel_addresses) knows to reach them at their kernel addresses.
  static_assert(kIterator<Base>, "in_place: TensorIterator ops only; others go through a HostCall");
  if (in_place_now<Base>(label, self, args...)) return self;
  struct Job : Pooled<Job> {
    Job(c10::DeviceIndex device, const at::Tensor& s, const Args&... a)
        : held(device), self(held.share(s)), args(held_arg(held, false, a)...), op(s) {}
    KernelArgs held;
    at::Tensor self;
    std::tuple<Args...> args;
    InPlace<Base> op;
  };
  auto job = std::make_unique<Job>(launch_device(self, args...), self, args...);
  job->op.rebind(job->self);
  std::apply([&](const auto&... a) { job->op.meta(job->self, a...); }, job->args);
  const c10::DeviceIndex device = self.device().index();
  if constexpr (kIterator<Base>) {
    if (!uniform_dtype(job->op)) {
      run_host_kernel(label, self, args...);
      return self;
    }
  }
  const bool short_kernel = is_short_kernel(job->op.numel());
  launch_async(device, label, [job = std::move(job)] {
    if constexpr (kIterator<Base>) use_kernel_addresses(job->op);
    std::apply([&](const auto&... a) { job->op.impl(job->self, a..., job->self); }, job->args);
  }, short_kernel);
  return self;
}

} // namespace my_device::structured
