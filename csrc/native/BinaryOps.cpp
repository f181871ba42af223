// add, sub, mul and div without the host kernel's boxing and aliasing.
//
// These dominate small-tensor workloads (optimizer steps, elementwise glue),
// where host-kernel overhead would be most of the op's time. PyTorch's own
// structured CPU kernels run here directly on mydev tensors: meta() builds the
// TensorIterator over device tensors (checking devices, broadcasting and type
// promotion exactly as on CPU), the output comes from the device allocator,
// and impl() calls the op's DispatchStub for PrivateUse1, whose entry is the
// CPU loop (mirror_cpu_stub below). This is how a vendor would plug in device
// loops: register their own function in the PrivateUse1 slot instead.

// The wheel's libtorch_cpu is built with these CPU-capability kernels, and the
// DispatchStub header only declares the matching members when they are defined.
#if defined(__x86_64__)
#define HAVE_AVX2_CPU_DEFINITION
#define HAVE_AVX512_CPU_DEFINITION
#endif

#include <ATen/Version.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/ScalarOps.h>
#include <ATen/ops/add.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/div.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/sub_native.h>
#include <tuple>
#include <torch/library.h>

#include "Factory.h"
#include "HostKernel.h"
#include "core/JobPool.h"
#include "core/TensorImpl.h"

namespace my_device {
namespace {

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

const bool g_stubs_mirrored = [] {
  mirror_cpu_stub(at::native::add_stub);
  mirror_cpu_stub(at::native::mul_stub);
  mirror_cpu_stub(at::native::div_true_stub);
  return true;
}();

// A structured kernel whose output is a new mydev tensor. The output is shared
// with the caller while the queued kernel runs, so it is a plain Tensor (an
// ExclusivelyOwned one would be destroyed regardless of the caller's reference).
template <class Base>
struct Functional final : Base {
  void set_output_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options) override {
    output = empty_device(sizes, strides, options);
    Base::set_output_raw_strided(idx, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    output = empty_device(sizes, strides, options);
    Base::set_output_raw_strided(idx, sizes, strides, options);
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
    Base::set_output_raw_strided(idx, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t idx, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    check(sizes, options);
    Base::set_output_raw_strided(idx, sizes, strides, options);
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
bool uniform_dtype(const at::TensorIteratorBase& iter) {
  for (int i = 0; i < iter.ntensors(); ++i) {
    if (iter.dtype(i) != iter.common_dtype()) return false;
  }
  return true;
}

// `tensor op python_number` arrives with the number as a 0-dim CPU double or
// int64 "wrapped number". When type promotion keeps the tensor's dtype (the
// usual case: float tensor times 0.5), converting the number first is exactly
// what the CPU iterator would do, and keeps the op on the queued path.
at::Tensor match_wrapped_scalar(const at::Tensor& self, const at::Tensor& other) {
  if (other.dim() != 0 || !other.unsafeGetTensorImpl()->is_wrapped_number() || other.is_same(self)) {
    return other;
  }
  const auto common = at::result_type(self, other);
  if (common != self.scalar_type() || other.scalar_type() == common) {
    return other;
  }
  at::Tensor converted = at::detail::scalar_tensor_static(other.item(), common, at::kCPU);
  converted.unsafeGetTensorImpl()->set_wrapped_number(true);
  return converted;
}

template <class T>
const T& host_arg(HostCall&, const T& value) {
  return value;
}
at::Tensor host_arg(HostCall& call, const at::Tensor& t) {
  return call.to_host(t);
}

// The kernel is queued: meta() runs now (shapes, dtypes, device checks,
// output allocation) and impl() runs on the stream's worker. The TensorIterator
// borrows its operands, so the job owns copies of them, and the job lives
// until the kernel has run. `on_host` computes the same op with PyTorch's CPU
// operator on host views, for the mixed-dtype case.
template <class Base, class OnHost, class... Args>
at::Tensor functional(const char* label, OnHost on_host, const Args&... args) {
  struct Job : Pooled<Job> {
    Job(const Args&... a) : args(a...) {}
    std::tuple<Args...> args;
    Functional<Base> op;
  };
  auto job = std::make_unique<Job>(args...);
  std::apply([&](const auto&... a) { job->op.meta(a...); }, job->args);
  const c10::DeviceIndex device = job->op.output.device().index();
  if (!uniform_dtype(job->op)) {
    return run_on_host(device, [&](HostCall& call) { return call.to_device(on_host(host_arg(call, args)...)); });
  }
  // The caller gets its own TensorImpl (kernel_handle): outputs are the tensors
  // most often dropped while their kernel is still queued. Inputs are held as
  // given; giving each its own TensorImpl measured slower than it saves.
  at::Tensor out = kernel_handle(job->op.output);
  launch_async(device, label, [job = std::move(job)] {
    std::apply([&](const auto&... a) { job->op.impl(a..., job->op.output); }, job->args);
  });
  return out;
}

template <class Base, class OnHost, class... Args>
at::Tensor& in_place(const char* label, OnHost on_host, at::Tensor& self, const Args&... args) {
  struct Job : Pooled<Job> {
    Job(const at::Tensor& s, const Args&... a) : self(s), args(a...), op(s) {}
    at::Tensor self;
    std::tuple<Args...> args;
    InPlace<Base> op;
  };
  auto job = std::make_unique<Job>(self, args...);
  job->op.rebind(job->self);
  std::apply([&](const auto&... a) { job->op.meta(job->self, a...); }, job->args);
  const c10::DeviceIndex device = self.device().index();
  if (!uniform_dtype(job->op)) {
    run_on_host(device, [&](HostCall& call) {
      on_host(call.to_host(self), host_arg(call, args)...);
      return true;
    });
    return self;
  }
  launch_async(device, label, [job = std::move(job)] {
    std::apply([&](const auto&... a) { job->op.impl(job->self, a..., job->self); }, job->args);
  });
  return self;
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  auto on_host = [](const at::Tensor& a, const at::Tensor& b, const at::Scalar& s) { return at::add(a, b, s); };
  return functional<at::native::structured_ufunc_add_CPU>("aten::add.Tensor", on_host, self,
                                                          match_wrapped_scalar(self, other), alpha);
}

at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  auto on_host = [](at::Tensor a, const at::Tensor& b, const at::Scalar& s) { a.add_(b, s); };
  return in_place<at::native::structured_ufunc_add_CPU>("aten::add_.Tensor", on_host, self,
                                                        match_wrapped_scalar(self, other), alpha);
}

at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  auto on_host = [](const at::Tensor& a, const at::Tensor& b, const at::Scalar& s) { return at::sub(a, b, s); };
  return functional<at::native::structured_sub_out>("aten::sub.Tensor", on_host, self,
                                                    match_wrapped_scalar(self, other), alpha);
}

at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  auto on_host = [](at::Tensor a, const at::Tensor& b, const at::Scalar& s) { a.sub_(b, s); };
  return in_place<at::native::structured_sub_out>("aten::sub_.Tensor", on_host, self,
                                                  match_wrapped_scalar(self, other), alpha);
}

at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  auto on_host = [](const at::Tensor& a, const at::Tensor& b) { return at::mul(a, b); };
  return functional<at::native::structured_mul_out>("aten::mul.Tensor", on_host, self,
                                                    match_wrapped_scalar(self, other));
}

at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) {
  auto on_host = [](at::Tensor a, const at::Tensor& b) { a.mul_(b); };
  return in_place<at::native::structured_mul_out>("aten::mul_.Tensor", on_host, self,
                                                  match_wrapped_scalar(self, other));
}

at::Tensor div(const at::Tensor& self, const at::Tensor& other) {
  auto on_host = [](const at::Tensor& a, const at::Tensor& b) { return at::div(a, b); };
  return functional<at::native::structured_div_out>("aten::div.Tensor", on_host, self,
                                                    match_wrapped_scalar(self, other));
}

at::Tensor& div_(at::Tensor& self, const at::Tensor& other) {
  auto on_host = [](at::Tensor a, const at::Tensor& b) { a.div_(b); };
  return in_place<at::native::structured_div_out>("aten::div_.Tensor", on_host, self,
                                                  match_wrapped_scalar(self, other));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
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
