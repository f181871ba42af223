// The class-target loss nll_loss (forward and backward) as queued structured
// kernels (StructuredKernel.h): cross_entropy's last op, called once per
// training step each way, on tensors of a batch's size.
//
// Their CPU kernels check each target index while they run. Queued, an index
// out of range fails on the worker, and the next synchronisation raises
// "aten::nll_loss_forward: Target 7 is out of bounds.", as CUDA's kernels
// report a device-side assert; the device stays usable. What the CPU kernels
// reject before reading any value (a dtype they have no loop for, a weight,
// grad_output or total_weight of another dtype than the input, a target
// neither int64 nor uint8) goes to the host kernel, which runs a dtype
// signature's first call at the call, so those errors come there, as on CPU.
// (nll_loss2d_forward/backward, not structured in torch 2.13, stay host kernels.)
#include "StructuredKernel.h"

#include <ATen/ops/nll_loss_backward_native.h>
#include <ATen/ops/nll_loss_forward_native.h>
#include <torch/library.h>

namespace my_device {
namespace {

using namespace structured;

// Whether the CPU loop runs for these dtypes (AT_DISPATCH_FLOATING_TYPES_AND2
// over the input; the other floating tensors read as the input's type; the
// target read as uint8 or int64).
bool queueable(const at::Tensor& self, const at::Tensor& target, std::initializer_list<const at::Tensor*> same) {
  if (!at::isFloatingType(self.scalar_type())) return false;
  if (target.scalar_type() != at::kLong && target.scalar_type() != at::kByte) return false;
  for (const at::Tensor* t : same) {
    if (t->defined() && t->scalar_type() != self.scalar_type()) return false;
  }
  return true;
}

const at::Tensor& defined_or_empty(const std::optional<at::Tensor>& t) {
  static const at::Tensor undefined;
  return t ? *t : undefined;
}

} // namespace
} // namespace my_device

namespace my_device::structured {
// Their impl()s loop over data pointers; the rest are ops on the tensors
// (contiguous(), the backward's zero_(), an empty target's fills).
template <>
struct RunsOnDeviceTensors<at::native::structured_nll_loss_forward_out_cpu> : OnDeviceTensors {};
template <>
struct RunsOnDeviceTensors<at::native::structured_nll_loss_backward_out_cpu> : OnDeviceTensors {};
} // namespace my_device::structured

namespace my_device {
namespace {

std::tuple<at::Tensor, at::Tensor> nll_loss_forward(const at::Tensor& self, const at::Tensor& target,
                                                    const std::optional<at::Tensor>& weight, int64_t reduction,
                                                    int64_t ignore_index) {
  constexpr const char* kLabel = "aten::nll_loss_forward";
  const at::Tensor& w = defined_or_empty(weight);
  check_same_device("nll_loss_forward", {{"self", self}, {"target", target}, {"weight", w}});
  if (!queueable(self, target, {&w})) {
    auto stack = run_host_kernel(kLabel, self, target, weight, reduction, ignore_index);
    return {stack[0].toTensor(), stack[1].toTensor()};
  }
  return functional_tuple<at::native::structured_nll_loss_forward_out_cpu, 2>(
      kLabel, self, target, HeldOptionalTensor(weight), reduction, ignore_index);
}

at::Tensor nll_loss_backward(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                             const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                             const at::Tensor& total_weight) {
  constexpr const char* kLabel = "aten::nll_loss_backward";
  const at::Tensor& w = defined_or_empty(weight);
  check_same_device("nll_loss_backward", {{"grad_output", grad_output}, {"self", self}, {"target", target},
                                          {"weight", w}, {"total_weight", total_weight}});
  if (!queueable(self, target, {&w, &grad_output, &total_weight})) {
    return run_host_kernel(kLabel, grad_output, self, target, weight, reduction, ignore_index, total_weight)[0]
        .toTensor();
  }
  return functional<at::native::structured_nll_loss_backward_out_cpu>(
      kLabel, grad_output, self, target, HeldOptionalTensor(weight), reduction, ignore_index, total_weight);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("nll_loss_forward", TORCH_FN(nll_loss_forward));
  m.impl("nll_loss_backward", TORCH_FN(nll_loss_backward));
}

} // namespace
} // namespace my_device
