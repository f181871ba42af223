// aten::gelu gets its own autograd kernel on mydev (AutogradPrivateUse1 only;
// every other device keeps PyTorch's).
//
// Why: PyTorch's derivative of gelu calls aten::gelu_backward, which on mydev
// is a host kernel. Host kernels run inline (launch_inline): the autograd
// engine's thread waits for the stream to drain at every gelu in the backward
// pass. The output of a gelu backward has the input's shape, so nothing has to
// be known on the host, and my_device::gelu_backward queues it instead
// (launch_async), letting the engine run ahead of the device as with any
// asynchronous accelerator. The queued kernel is PyTorch's CPU loop for
// gelu_backward, pointed at device memory.
//
// my_device::gelu_backward is not differentiable; when a double backward is
// being recorded (create_graph=True) the override uses aten::gelu_backward,
// whose own derivative PyTorch provides. A C++ Function has no forward-mode
// derivative and cannot run under functorch transforms (torch.func.grad, vmap),
// both of which PyTorch's kernel supports: those calls get gelu's formula in
// differentiable aten ops instead of the override.
#include <ATen/ops/erf.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/gelu_backward_cpu_dispatch.h>
#include <ATen/ops/tanh.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include <cmath>

#include "OpSupport.h"
#include "core/KernelArgs.h"
#include "native/Factory.h"

namespace my_device::ops {
namespace {

constexpr char kGeluBackward[] = "my_device::gelu_backward";

void check_inputs(const at::Tensor& grad_output, const at::Tensor& self) {
  TORCH_CHECK(grad_output.sym_sizes() == self.sym_sizes(), kGeluBackward, ": grad_output has shape ",
              grad_output.sym_sizes(), " but self has shape ", self.sym_sizes());
  TORCH_CHECK(grad_output.scalar_type() == self.scalar_type(), kGeluBackward,
              ": grad_output and self must have the same dtype, got ", grad_output.scalar_type(), " and ",
              self.scalar_type());
}

// CPU and Meta kernel.
at::Tensor gelu_backward_host(const at::Tensor& grad_output, const at::Tensor& self, c10::string_view approximate) {
  check_inputs(grad_output, self);
  return at::gelu_backward(grad_output, self, approximate);
}

at::Tensor gelu_backward_mydev(const at::Tensor& grad_output, const at::Tensor& self,
                               c10::string_view approximate) {
  const c10::DeviceIndex device = check_same_device(kGeluBackward, {&grad_output, &self});
  check_inputs(grad_output, self);
  TORCH_CHECK(approximate == "none" || approximate == "tanh", kGeluBackward,
              ": approximate must be 'none' or 'tanh', got '", approximate, "'");
  at::Tensor grad_input = empty_device(self.sizes(), {}, self.options());
  // The caller's references may be gone when it runs (KernelArgs.h).
  KernelArgs held(device);
  launch_async(device, kGeluBackward, [grad_output = held.own(grad_output), self = held.own(self),
                                       grad_input = held.own(grad_input), approximate = std::string(approximate)] {
    HostCall call(grad_input.device().index());
    at::Tensor out = call.to_host(grad_input);
    at::cpu::gelu_backward_out(out, call.to_host(grad_output), call.to_host(self), approximate);
  });
  return grad_input;
}

using GeluBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);

class GeluFunction : public torch::autograd::Function<GeluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& self,
                            const std::string& approximate) {
    count_on_mydev("gelu.forward", self);
    ctx->save_for_backward({self});
    ctx->saved_data["approximate"] = approximate;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return at::gelu(self, approximate);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor self = ctx->get_saved_variables()[0];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    count_on_mydev("gelu.backward", self);
    if (at::GradMode::is_enabled()) {
      return {at::gelu_backward(grads[0], self, approximate), at::Tensor()};
    }
    static const auto op = op_handle<GeluBackwardSig>(kGeluBackward);
    return {op.call(grads[0], self, approximate), at::Tensor()};
  }
};

bool needs_generic_autograd(const at::Tensor& self) {
  return self._fw_grad(/*level=*/0).defined() ||
         c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

at::Tensor gelu_formula(const at::Tensor& x, c10::string_view approximate) {
  if (approximate == "tanh") {
    const double sqrt_2_over_pi = std::sqrt(2.0 / M_PI);
    return 0.5 * x * (1 + at::tanh(sqrt_2_over_pi * (x + 0.044715 * x.pow(3))));
  }
  return 0.5 * x * (1 + at::erf(x * M_SQRT1_2));
}

at::Tensor gelu_autograd(const at::Tensor& self, c10::string_view approximate) {
  if (needs_generic_autograd(self)) {
    TORCH_CHECK(approximate == "none" || approximate == "tanh", "approximate argument must be either none or tanh.");
    return gelu_formula(self, approximate);
  }
  return GeluFunction::apply(self, std::string(approximate));
}

TORCH_LIBRARY_FRAGMENT(my_device, m) {
  m.def("gelu_backward(Tensor grad_output, Tensor self, *, str approximate='none') -> Tensor");
}

TORCH_LIBRARY_IMPL(my_device, PrivateUse1, m) {
  m.impl("gelu_backward", TORCH_FN(gelu_backward_mydev));
}

TORCH_LIBRARY_IMPL(my_device, CPU, m) {
  m.impl("gelu_backward", TORCH_FN(gelu_backward_host));
}

TORCH_LIBRARY_IMPL(my_device, Meta, m) {
  m.impl("gelu_backward", TORCH_FN(gelu_backward_host));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("gelu", TORCH_FN(gelu_autograd));
}

} // namespace
} // namespace my_device::ops
