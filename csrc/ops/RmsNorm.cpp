// my_device::rms_norm and its fused backward, my_device::rms_norm_backward.
//
// The forward is differentiated by a C++ autograd Function registered for
// AutogradPrivateUse1 (and AutogradCPU, so the CPU reference differentiates the
// same way). Its backward calls the fused backward op, which computes both
// gradients in one kernel. That kernel is not itself differentiable, so the
// backward op has its own autograd kernel: when a gradient of the gradient is
// being recorded (create_graph=True), it computes the same formula with aten
// ops, which autograd can differentiate again.
#include <ATen/ops/rsqrt.h>
#include <torch/autograd.h>

#include "OpSupport.h"

namespace my_device::ops {
namespace {

constexpr char kRmsNorm[] = "my_device::rms_norm";
constexpr char kRmsNormBackward[] = "my_device::rms_norm_backward";

void check_inputs(const char* op, const at::Tensor& input, const at::Tensor& weight) {
  TORCH_CHECK(input.dim() >= 1, op, ": input must have at least one dimension");
  TORCH_CHECK(weight.dim() == 1 && weight.sym_size(0) == input.sym_size(-1), op,
              ": weight must have shape [", input.sym_size(-1), "] (the last dimension of input ",
              input.sym_sizes(), "), but got ", weight.sym_sizes());
  TORCH_CHECK(input.scalar_type() == weight.scalar_type(), op, ": input and weight must have the same dtype, got ",
              input.scalar_type(), " and ", weight.scalar_type());
}

// 1 / sqrt(mean(x^2) + eps) over the last dimension, kept for broadcasting.
at::Tensor inv_rms(const at::Tensor& input, double eps) {
  return at::rsqrt(input.pow(2).mean(-1, /*keepdim=*/true).add(eps));
}

// The host implementation: CPU kernel, Meta kernel, and (on device views) the mydev kernel.
at::Tensor rms_norm_host(const at::Tensor& input, const at::Tensor& weight, double eps) {
  check_inputs(kRmsNorm, input, weight);
  return input * inv_rms(input, eps) * weight;
}

// With y = x * r * w and r = inv_rms(x): dw = sum over rows of g * x * r, and
// dx = r * (g*w - x*r * mean(g*w * x*r)). Written with aten ops so that the same
// code is also the differentiable path for double backward.
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_host(const at::Tensor& grad_output, const at::Tensor& input,
                                                          const at::Tensor& weight, double eps) {
  check_inputs(kRmsNormBackward, input, weight);
  TORCH_CHECK(grad_output.sym_sizes() == input.sym_sizes(), kRmsNormBackward, ": grad_output has shape ",
              grad_output.sym_sizes(), " but input has shape ", input.sym_sizes());
  const at::Tensor r = inv_rms(input, eps);
  const at::Tensor normed = input * r;
  const at::Tensor grad_weight = (grad_output * normed).reshape_symint({-1, input.sym_size(-1)}).sum(0);
  const at::Tensor grad_normed = grad_output * weight;
  const at::Tensor grad_input = r * (grad_normed - normed * (grad_normed * normed).mean(-1, /*keepdim=*/true));
  return {grad_input, grad_weight};
}

using RmsNormSig = at::Tensor(const at::Tensor&, const at::Tensor&, double);
using RmsNormBackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                              const at::Tensor&, double);

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, double eps) {
    count_on_mydev("rms_norm.forward", input);
    ctx->save_for_backward({input, weight});
    ctx->saved_data["eps"] = eps;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = op_handle<RmsNormSig>(kRmsNorm);
    return op.call(input, weight, eps);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    count_on_mydev("rms_norm.backward", saved[0]);
    // Through the dispatcher with autograd, so that double backward reaches
    // rms_norm_backward_autograd below.
    static const auto op = op_handle<RmsNormBackwardSig>(kRmsNormBackward);
    auto [grad_input, grad_weight] = op.call(grads[0], saved[0], saved[1], ctx->saved_data["eps"].toDouble());
    return {grad_input, grad_weight, at::Tensor()};
  }
};

at::Tensor rms_norm_autograd(const at::Tensor& input, const at::Tensor& weight, double eps) {
  return RmsNormFunction::apply(input, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_autograd(const at::Tensor& grad_output,
                                                              const at::Tensor& input, const at::Tensor& weight,
                                                              double eps) {
  const bool record = at::GradMode::is_enabled() &&
                      (grad_output.requires_grad() || input.requires_grad() || weight.requires_grad());
  if (record) {
    count_on_mydev("rms_norm_backward.differentiable", input);
    return rms_norm_backward_host(grad_output, input, weight, eps);
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  static const auto op = op_handle<RmsNormBackwardSig>(kRmsNormBackward);
  return op.call(grad_output, input, weight, eps);
}

TORCH_LIBRARY_FRAGMENT(my_device, m) {
  m.def("rms_norm(Tensor input, Tensor weight, float eps) -> Tensor");
  m.def("rms_norm_backward(Tensor grad_output, Tensor input, Tensor weight, float eps) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(my_device, PrivateUse1, m) {
  m.impl("rms_norm", TORCH_FN((OnMyDev<kRmsNorm, &rms_norm_host>::call)));
  m.impl("rms_norm_backward", TORCH_FN((OnMyDev<kRmsNormBackward, &rms_norm_backward_host>::call)));
}

TORCH_LIBRARY_IMPL(my_device, CPU, m) {
  m.impl("rms_norm", TORCH_FN(rms_norm_host));
  m.impl("rms_norm_backward", TORCH_FN(rms_norm_backward_host));
}

TORCH_LIBRARY_IMPL(my_device, Meta, m) {
  m.impl("rms_norm", TORCH_FN(rms_norm_host));
  m.impl("rms_norm_backward", TORCH_FN(rms_norm_backward_host));
}

TORCH_LIBRARY_IMPL(my_device, AutogradPrivateUse1, m) {
  m.impl("rms_norm", TORCH_FN(rms_norm_autograd));
  m.impl("rms_norm_backward", TORCH_FN(rms_norm_backward_autograd));
}

TORCH_LIBRARY_IMPL(my_device, AutogradCPU, m) {
  m.impl("rms_norm", TORCH_FN(rms_norm_autograd));
  m.impl("rms_norm_backward", TORCH_FN(rms_norm_backward_autograd));
}

} // namespace
} // namespace my_device::ops
