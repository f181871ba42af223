#pragma once
// Shared plumbing for the my_device:: custom operators (csrc/ops/).
//
// Most ops have one host implementation written with aten ops. It is the CPU
// kernel, the Meta kernel (aten's meta kernels propagate shapes, including
// symbolic ones, so FakeTensor and torch.compile see exactly the checks and
// shapes the real kernels have), and, through OnMyDev, the mydev kernel: the
// CPU code runs in stream order directly on the device bytes. Ops whose output
// shapes are known before they run are queued on mydev instead (launch_async:
// FusedAdamW.cpp, GeluAutogradOverride.cpp).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>

#include "native/hostkernel/HostKernel.h"

namespace my_device::ops {

// Counts an event ("rms_norm.forward", ...) when `t` is a mydev tensor, so tests
// can prove that a mydev-specific kernel (e.g. an AutogradPrivateUse1 one) ran,
// and that it did not run for CPU tensors. Read by my_device::_counters.
void count_on_mydev(const char* event, const at::Tensor& t);

// Rejects tensors on different devices with a message naming the op. The
// dispatcher picks the mydev kernel if any argument is on mydev, so without
// this a CPU weight would be silently read as if it lived on the device.
// Returns the device of the call.
c10::DeviceIndex check_same_device(const char* op, std::initializer_list<const at::Tensor*> tensors);

// The dispatcher handle of `name` ("my_device::rms_norm"), typed as Signature.
template <class Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

namespace detail {
template <class T>
const T& host_arg(HostCall&, const T& value) {
  return value;
}
inline at::Tensor host_arg(HostCall& call, const at::Tensor& t) {
  return call.to_host(t);
}
inline std::optional<at::Tensor> host_arg(HostCall& call, const std::optional<at::Tensor>& t) {
  return call.to_host(t);
}
inline at::Tensor device_result(HostCall& call, const at::Tensor& t) {
  return call.to_device(t);
}
template <class... Ts>
std::tuple<Ts...> device_result(HostCall& call, const std::tuple<Ts...>& ts) {
  return std::apply([&](const auto&... t) { return std::make_tuple(call.to_device(t)...); }, ts);
}
template <class T>
const at::Tensor* tensor_ptr(const T&) {
  return nullptr;
}
inline const at::Tensor* tensor_ptr(const at::Tensor& t) {
  return &t;
}
inline const at::Tensor* tensor_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() ? &*t : nullptr;
}
} // namespace detail

// OnMyDev<name, host_impl>::call is the mydev kernel made from a host
// implementation: it checks devices, then runs `host_impl` on CPU views of the
// device tensors and maps its results back, without copies.
template <const char* name, auto host_impl>
struct OnMyDev;
template <const char* name, class R, class... Args, R (*host_impl)(Args...)>
struct OnMyDev<name, host_impl> {
  static R call(Args... args) {
    const c10::DeviceIndex device = check_same_device(name, {detail::tensor_ptr(args)...});
    return run_on_host(device, [&](HostCall& call) {
      return detail::device_result(call, host_impl(detail::host_arg(call, args)...));
    });
  }
};

} // namespace my_device::ops
