// Pointwise math and activations (and their backward kernels) on small tensors:
// the glue of every training step, queued as structured kernels
// (StructuredKernel.h) instead of running at the call as host kernels.
#include "StructuredKernel.h"

#include <ATen/native/Activation.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/Gelu.h>
#include <ATen/native/TensorCompare.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/ops/clamp_min.h>
#include <ATen/ops/clamp_min_native.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/exp_native.h>
#include <ATen/Context.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/gelu_backward_native.h>
#include <ATen/ops/gelu_native.h>
#include <ATen/ops/log.h>
#include <ATen/ops/log_native.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/rsqrt_native.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sigmoid_backward.h>
#include <ATen/ops/sigmoid_backward_native.h>
#include <ATen/ops/sigmoid_native.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_native.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/tanh_backward.h>
#include <ATen/ops/tanh_backward_native.h>
#include <ATen/ops/tanh_native.h>
#include <ATen/ops/threshold_backward.h>
#include <ATen/ops/threshold_backward_native.h>
#include <torch/library.h>

namespace my_device {
namespace {

using namespace structured;

// gelu's loops are called with kCPU by their structured class, so only these
// stubs are looked up by device. (silu_backward is served by its host kernel.)
const bool g_stubs_mirrored = [] {
  mirror_cpu_stub(at::native::exp_stub);
  mirror_cpu_stub(at::native::log_stub);
  mirror_cpu_stub(at::native::sqrt_stub);
  mirror_cpu_stub(at::native::rsqrt_stub);
  mirror_cpu_stub(at::native::sigmoid_stub);
  mirror_cpu_stub(at::native::tanh_stub);
  mirror_cpu_stub(at::native::silu_stub);
  mirror_cpu_stub(at::native::sigmoid_backward_stub);
  mirror_cpu_stub(at::native::tanh_backward_stub);
  mirror_cpu_stub(at::native::threshold_stub);
  mirror_cpu_stub(at::native::clamp_min_scalar_stub);
  return true;
}();

// One functional and one in-place kernel per unary op: `Base` is the op's
// structured CPU class.
#define MYDEV_UNARY(name, Base)                                  \
  at::Tensor name(const at::Tensor& self) {                      \
    return functional<Base>("aten::" #name, self);               \
  }                                                              \
  at::Tensor& name##_(at::Tensor& self) {                        \
    return in_place<Base>("aten::" #name "_", self);             \
  }

MYDEV_UNARY(exp, at::native::structured_exp_out)
MYDEV_UNARY(log, at::native::structured_log_out)
MYDEV_UNARY(sqrt, at::native::structured_sqrt_out)
MYDEV_UNARY(rsqrt, at::native::structured_rsqrt_out)
MYDEV_UNARY(sigmoid, at::native::structured_sigmoid_out)
MYDEV_UNARY(tanh, at::native::structured_tanh_out)
MYDEV_UNARY(silu, at::native::structured_silu_out)
#undef MYDEV_UNARY

// relu is clamp_min(self, 0) on the CPU too (NaN stays NaN).
at::Tensor relu(const at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");  // (the CPU's relu checks)
  return functional<at::native::structured_clamp_min_out>("aten::relu", self, at::Scalar(0));
}

at::Tensor& relu_(at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
  return in_place<at::native::structured_clamp_min_out>("aten::relu_", self, at::Scalar(0));
}

// The CPU's gelu and gelu_backward take oneDNN's kernel for an exact gelu of a
// contiguous float, bfloat16 or half input of more than one element, the last
// two where the CPU has oneDNN support for them (use_mkldnn in ATen's
// Activation.cpp, which also asks for a CPU tensor and looks at self only, so
// the structured impl() given mydev tensors takes ATen's own loop: last-bit
// differences). Such calls go to the host kernel, which runs the CPU op on host
// aliases of the device memory, where the CPU's own checks choose its path.
bool cpu_may_take_onednn(const at::Tensor& self, c10::string_view approximate) {
  return at::hasMKLDNN() && at::globalContext().userEnabledMkldnn() && approximate == "none" &&
         self.numel() > 1 && self.is_contiguous() &&
         (self.scalar_type() == at::kFloat || self.scalar_type() == at::kBFloat16 ||
          self.scalar_type() == at::kHalf);
}

// The job keeps its own copy of `approximate`: the caller's string_view dies at return.
// gelu's CPU impl(), not its meta function, parses `approximate`: it is parsed
// here too, so that a bad value is raised at the call, not on the worker.
at::Tensor gelu(const at::Tensor& self, c10::string_view approximate) {
  (void)at::native::get_gelutype_enum(approximate);
  if (cpu_may_take_onednn(self, approximate)) {
    return run_host_kernel("aten::gelu", self, std::string(approximate))[0].toTensor();
  }
  return functional<at::native::structured_gelu_out_cpu>("aten::gelu", self, std::string(approximate));
}

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate) {
  (void)at::native::get_gelutype_enum(approximate);
  if (cpu_may_take_onednn(self, approximate)) {
    return run_host_kernel("aten::gelu_backward", grad, self, std::string(approximate))[0].toTensor();
  }
  return functional<at::native::structured_gelu_backward_out_cpu>("aten::gelu_backward", grad, self, std::string(approximate));
}

at::Tensor sigmoid_backward(const at::Tensor& grad, const at::Tensor& output) {
  return functional<at::native::structured_sigmoid_backward_out>("aten::sigmoid_backward", grad, output);
}

at::Tensor tanh_backward(const at::Tensor& grad, const at::Tensor& output) {
  return functional<at::native::structured_tanh_backward_out>("aten::tanh_backward", grad, output);
}

at::Tensor threshold_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& threshold) {
  return functional<at::native::structured_threshold_backward_out>("aten::threshold_backward", grad, self, threshold);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const auto& [name, fn] : std::initializer_list<std::pair<const char*, at::Tensor (*)(const at::Tensor&)>>{
           {"exp", &exp}, {"log", &log}, {"sqrt", &sqrt}, {"rsqrt", &rsqrt}, {"sigmoid", &sigmoid},
           {"tanh", &tanh}, {"silu", &silu}, {"relu", &relu}}) {
    m.impl(name, fn);
  }
  for (const auto& [name, fn] : std::initializer_list<std::pair<const char*, at::Tensor& (*)(at::Tensor&)>>{
           {"exp_", &exp_}, {"log_", &log_}, {"sqrt_", &sqrt_}, {"rsqrt_", &rsqrt_}, {"sigmoid_", &sigmoid_},
           {"tanh_", &tanh_}, {"silu_", &silu_}, {"relu_", &relu_}}) {
    m.impl(name, fn);
  }
  m.impl("gelu", TORCH_FN(gelu));
  m.impl("gelu_backward", TORCH_FN(gelu_backward));
  m.impl("sigmoid_backward", TORCH_FN(sigmoid_backward));
  m.impl("tanh_backward", TORCH_FN(tanh_backward));
  m.impl("threshold_backward", TORCH_FN(threshold_backward));
}

} // namespace
} // namespace my_device
