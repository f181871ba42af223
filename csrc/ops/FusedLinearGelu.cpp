// my_device::fused_linear_gelu: gelu(input @ weight^T + bias) in one op.
//
// The forward applies the activation in place on the matmul's output, so the
// pre-activation is never kept: backward recomputes it, trading one matmul for
// the memory of one activation per layer (as fused vendor kernels do). The
// backward is written with differentiable aten ops, so double backward works.
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/linear.h>
#include <torch/autograd.h>

#include "OpSupport.h"

namespace my_device::ops {
namespace {

constexpr char kFusedLinearGelu[] = "my_device::fused_linear_gelu";

void check_inputs(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(input.dim() >= 1, kFusedLinearGelu, ": input must have at least one dimension");
  TORCH_CHECK(weight.dim() == 2, kFusedLinearGelu, ": weight must be 2-D [out_features, in_features], but got ",
              weight.sym_sizes());
  TORCH_CHECK(input.sym_size(-1) == weight.sym_size(1), kFusedLinearGelu, ": input's last dimension (",
              input.sym_size(-1), ") must equal weight's in_features (", weight.sym_size(1), ")");
  TORCH_CHECK(input.scalar_type() == weight.scalar_type(), kFusedLinearGelu,
              ": input and weight must have the same dtype, got ", input.scalar_type(), " and ",
              weight.scalar_type());
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0), kFusedLinearGelu,
                ": bias must have shape [", weight.sym_size(0), "] (out_features), but got ", bias->sym_sizes());
    TORCH_CHECK(bias->scalar_type() == input.scalar_type(), kFusedLinearGelu,
                ": bias must have the dtype of input, got ", bias->scalar_type());
  }
}

// The host implementation: CPU kernel, Meta kernel, and (on device views) the mydev kernel.
at::Tensor fused_linear_gelu_host(const at::Tensor& input, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias) {
  check_inputs(input, weight, bias);
  at::Tensor out = at::linear(input, weight, bias);
  at::gelu_(out);
  return out;
}

using FusedLinearGeluSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&);

class FusedLinearGeluFunction : public torch::autograd::Function<FusedLinearGeluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
    count_on_mydev("fused_linear_gelu.forward", input);
    ctx->save_for_backward({input, weight, bias.value_or(at::Tensor())});
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = op_handle<FusedLinearGeluSig>(kFusedLinearGelu);
    return op.call(input, weight, bias);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& bias = saved[2];
    count_on_mydev("fused_linear_gelu.backward", input);
    const at::Tensor pre_activation = at::linear(input, weight, bias.defined() ? std::optional(bias) : std::nullopt);
    // [..., out] flattened to rows, for the weight and bias reductions.
    const at::Tensor grad_rows =
        at::gelu_backward(grads[0], pre_activation).reshape_symint({-1, weight.sym_size(0)});
    at::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_input = grad_rows.mm(weight).reshape_symint(input.sym_sizes());
    }
    if (ctx->needs_input_grad(1)) {
      grad_weight = grad_rows.t().mm(input.reshape_symint({-1, weight.sym_size(1)}));
    }
    if (bias.defined() && ctx->needs_input_grad(2)) {
      grad_bias = grad_rows.sum(0);
    }
    return {grad_input, grad_weight, grad_bias};
  }
};

at::Tensor fused_linear_gelu_autograd(const at::Tensor& input, const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias) {
  return FusedLinearGeluFunction::apply(input, weight, bias);
}

TORCH_LIBRARY_FRAGMENT(my_device, m) {
  m.def("fused_linear_gelu(Tensor input, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(my_device, PrivateUse1, m) {
  m.impl("fused_linear_gelu", TORCH_FN((OnMyDev<kFusedLinearGelu, &fused_linear_gelu_host>::call)));
}

TORCH_LIBRARY_IMPL(my_device, CPU, m) {
  m.impl("fused_linear_gelu", TORCH_FN(fused_linear_gelu_host));
}

TORCH_LIBRARY_IMPL(my_device, Meta, m) {
  m.impl("fused_linear_gelu", TORCH_FN(fused_linear_gelu_host));
}

TORCH_LIBRARY_IMPL(my_device, AutogradPrivateUse1, m) {
  m.impl("fused_linear_gelu", TORCH_FN(fused_linear_gelu_autograd));
}

TORCH_LIBRARY_IMPL(my_device, AutogradCPU, m) {
  m.impl("fused_linear_gelu", TORCH_FN(fused_linear_gelu_autograd));
}

} // namespace
} // namespace my_device::ops
