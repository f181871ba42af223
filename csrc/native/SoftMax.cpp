// softmax and log_softmax (and their backward kernels) as queued structured
// kernels (StructuredKernel.h): every classifier's last layer and loss.
#include "StructuredKernel.h"

#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/_log_softmax_backward_data.h>
#include <ATen/ops/_log_softmax_backward_data_native.h>
#include <ATen/ops/_log_softmax_native.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/_softmax_backward_data_native.h>
#include <ATen/ops/_softmax_native.h>
#include <torch/library.h>


namespace my_device::structured {
// Their impl()s make the input contiguous, view a 0-d input as 1-d, and call
// the CPU loop through its stub with kCPU.
template <>
struct RunsOnDeviceTensors<at::native::structured_softmax_cpu_out> : OnDeviceTensors {};
template <>
struct RunsOnDeviceTensors<at::native::structured_log_softmax_cpu_out> : OnDeviceTensors {};
template <>
struct RunsOnDeviceTensors<at::native::structured_softmax_backward_cpu_out> : OnDeviceTensors {};
template <>
struct RunsOnDeviceTensors<at::native::structured_log_softmax_backward_cpu_out> : OnDeviceTensors {};
} // namespace my_device::structured

namespace my_device {
namespace {

using namespace structured;

// What the CPU kernels reject only when they run (integer inputs, half_to_float)
// goes through the host kernel, which runs a dtype signature's first call at
// the call, so the error comes there.
bool queueable(const at::Tensor& t, bool half_to_float = false) {
  return at::isFloatingType(t.scalar_type()) && !half_to_float;
}

template <class Base>
at::Tensor softmax_like(const char* label, const at::Tensor& self, int64_t dim, bool half_to_float) {
  if (!queueable(self, half_to_float)) return run_host_kernel(label, self, dim, half_to_float)[0].toTensor();
  return functional<Base>(label, self, dim, half_to_float);
}

at::Tensor softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  return softmax_like<at::native::structured_softmax_cpu_out>("aten::_softmax", self, dim, half_to_float);
}

at::Tensor log_softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  return softmax_like<at::native::structured_log_softmax_cpu_out>("aten::_log_softmax", self, dim, half_to_float);
}

template <class Base>
at::Tensor backward_like(const char* op, const char* label, const at::Tensor& grad, const at::Tensor& output,
                         int64_t dim, at::ScalarType input_dtype) {
  check_same_device(op, {{"grad_output", grad}, {"output", output}});
  if (!queueable(grad) || !queueable(output)) {
    return run_host_kernel(label, grad, output, dim, input_dtype)[0].toTensor();
  }
  return functional<Base>(label, grad, output, dim, input_dtype);
}

at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                            at::ScalarType input_dtype) {
  return backward_like<at::native::structured_softmax_backward_cpu_out>(
      "_softmax_backward_data", "aten::_softmax_backward_data", grad, output, dim, input_dtype);
}

at::Tensor log_softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                                at::ScalarType input_dtype) {
  return backward_like<at::native::structured_log_softmax_backward_cpu_out>(
      "_log_softmax_backward_data", "aten::_log_softmax_backward_data", grad, output, dim, input_dtype);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_softmax", TORCH_FN(softmax));
  m.impl("_log_softmax", TORCH_FN(log_softmax));
  m.impl("_softmax_backward_data", TORCH_FN(softmax_backward));
  m.impl("_log_softmax_backward_data", TORCH_FN(log_softmax_backward));
}

} // namespace
} // namespace my_device
