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

namespace my_device {
namespace {

using namespace structured;

// What the CPU kernels reject only when they run (integer inputs, half_to_float)
// runs now instead, so the error comes at the call.
bool queueable(const at::Tensor& t, bool half_to_float = false) {
  return at::isFloatingType(t.scalar_type()) && !half_to_float;
}

template <class Base, class OnHost>
at::Tensor softmax_like(const char* label, OnHost on_host, const at::Tensor& self, int64_t dim,
                        bool half_to_float) {
  if (!queueable(self, half_to_float)) return on_host_now(self.device().index(), on_host, self, dim, half_to_float);
  return functional<Base>(label, on_host, self, dim, half_to_float);
}

at::Tensor softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  return softmax_like<at::native::structured_softmax_cpu_out>(
      "aten::_softmax", [](const at::Tensor& a, int64_t d, bool h) { return at::_softmax(a, d, h); }, self, dim,
      half_to_float);
}

at::Tensor log_softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  return softmax_like<at::native::structured_log_softmax_cpu_out>(
      "aten::_log_softmax", [](const at::Tensor& a, int64_t d, bool h) { return at::_log_softmax(a, d, h); }, self,
      dim, half_to_float);
}

template <class Base, class OnHost>
at::Tensor backward_like(const char* op, const char* label, OnHost on_host, const at::Tensor& grad,
                         const at::Tensor& output, int64_t dim, at::ScalarType input_dtype) {
  check_same_device(op, {{"grad_output", grad}, {"output", output}});
  if (!queueable(grad) || !queueable(output)) {
    return on_host_now(grad.device().index(), on_host, grad, output, dim, input_dtype);
  }
  return functional<Base>(label, on_host, grad, output, dim, input_dtype);
}

at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                            at::ScalarType input_dtype) {
  return backward_like<at::native::structured_softmax_backward_cpu_out>(
      "_softmax_backward_data", "aten::_softmax_backward_data",
      [](const at::Tensor& g, const at::Tensor& o, int64_t d, at::ScalarType t) {
        return at::_softmax_backward_data(g, o, d, t);
      },
      grad, output, dim, input_dtype);
}

at::Tensor log_softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                                at::ScalarType input_dtype) {
  return backward_like<at::native::structured_log_softmax_backward_cpu_out>(
      "_log_softmax_backward_data", "aten::_log_softmax_backward_data",
      [](const at::Tensor& g, const at::Tensor& o, int64_t d, at::ScalarType t) {
        return at::_log_softmax_backward_data(g, o, d, t);
      },
      grad, output, dim, input_dtype);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_softmax", TORCH_FN(softmax));
  m.impl("_log_softmax", TORCH_FN(log_softmax));
  m.impl("_softmax_backward_data", TORCH_FN(softmax_backward));
  m.impl("_log_softmax_backward_data", TORCH_FN(log_softmax_backward));
}

} // namespace
} // namespace my_device
