// my_device::fused_adamw_: one AdamW step for one parameter, in a single pass
// over its elements (param, exp_avg and exp_avg_sq are read and written once),
// instead of the five elementwise kernels of the unfused update. The schema
// marks the three mutated tensors (a!, b!, c!), which is what lets
// functionalization and torch.compile handle it. Optimizer steps are not
// differentiated, so it has no autograd kernel.
//
// On mydev the step is queued (launch_async): it produces nothing the host has
// to wait for, so an optimizer can enqueue a whole model's update and return.
#include <ATen/Dispatch.h>

#include <cmath>

#include "OpSupport.h"

namespace my_device::ops {
namespace {

constexpr char kFusedAdamW[] = "my_device::fused_adamw_";

struct AdamWStep {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
};

void check_inputs(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                  const at::Tensor& grad, const AdamWStep& h) {
  TORCH_CHECK(at::isFloatingType(param.scalar_type()), kFusedAdamW, ": param must be floating point, got ",
              param.scalar_type());
  for (const at::Tensor* t : {&exp_avg, &exp_avg_sq, &grad}) {
    TORCH_CHECK(t->sym_sizes() == param.sym_sizes(), kFusedAdamW, ": every tensor must have param's shape ",
                param.sym_sizes(), ", got ", t->sym_sizes());
    TORCH_CHECK(t->scalar_type() == param.scalar_type(), kFusedAdamW,
                ": every tensor must have param's dtype ", param.scalar_type(), ", got ", t->scalar_type());
  }
  TORCH_CHECK(h.step >= 1, kFusedAdamW, ": step counts from 1, got ", h.step);
}

// The update loop reads raw memory, so it needs each tensor dense and
// in the same element order (optimizer state is created with empty_like/zeros_like).
void check_dense(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                 const at::Tensor& grad) {
  for (const at::Tensor* t : {&param, &exp_avg, &exp_avg_sq, &grad}) {
    TORCH_CHECK(t->is_contiguous(), kFusedAdamW, ": tensors must be contiguous");
  }
}

// Same arithmetic, in the same order, as torch.optim.AdamW's single-tensor step.
template <class T>
void adamw_loop(T* param, T* exp_avg, T* exp_avg_sq, const T* grad, int64_t n, const AdamWStep& h) {
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(h.beta2, static_cast<double>(h.step)));
  const T decay = static_cast<T>(1 - h.lr * h.weight_decay);
  const T step_size = static_cast<T>(h.lr / bias_correction1);
  const T one_minus_beta1 = static_cast<T>(1 - h.beta1);
  const T one_minus_beta2 = static_cast<T>(1 - h.beta2);
  const T beta2 = static_cast<T>(h.beta2);
  const T eps = static_cast<T>(h.eps);
  const T bc2_sqrt = static_cast<T>(bias_correction2_sqrt);
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    param[i] *= decay;
    exp_avg[i] += (g - exp_avg[i]) * one_minus_beta1;
    exp_avg_sq[i] = exp_avg_sq[i] * beta2 + one_minus_beta2 * g * g;
    const T denom = std::sqrt(exp_avg_sq[i]) / bc2_sqrt + eps;
    param[i] -= step_size * exp_avg[i] / denom;
  }
}

// Runs on whatever memory the tensors point at: host memory on CPU, device
// memory inside a mydev launch.
void adamw_update(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                  const at::Tensor& grad, const AdamWStep& h) {
  AT_DISPATCH_FLOATING_TYPES(param.scalar_type(), "fused_adamw_", [&] {
    adamw_loop<scalar_t>(param.mutable_data_ptr<scalar_t>(), exp_avg.mutable_data_ptr<scalar_t>(),
                         exp_avg_sq.mutable_data_ptr<scalar_t>(), grad.const_data_ptr<scalar_t>(), param.numel(),
                         h);
  });
}

void fused_adamw_cpu(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                     const at::Tensor& grad, double lr, double beta1, double beta2, double eps,
                     double weight_decay, int64_t step) {
  const AdamWStep h{lr, beta1, beta2, eps, weight_decay, step};
  check_inputs(param, exp_avg, exp_avg_sq, grad, h);
  check_dense(param, exp_avg, exp_avg_sq, grad);
  adamw_update(param, exp_avg, exp_avg_sq, grad, h);
}

void fused_adamw_meta(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                      const at::Tensor& grad, double lr, double beta1, double beta2, double eps,
                      double weight_decay, int64_t step) {
  check_inputs(param, exp_avg, exp_avg_sq, grad, {lr, beta1, beta2, eps, weight_decay, step});
}

void fused_adamw_mydev(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                       const at::Tensor& grad, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int64_t step) {
  const AdamWStep h{lr, beta1, beta2, eps, weight_decay, step};
  const c10::DeviceIndex device = check_same_device(kFusedAdamW, {&param, &exp_avg, &exp_avg_sq, &grad});
  check_inputs(param, exp_avg, exp_avg_sq, grad, h);
  check_dense(param, exp_avg, exp_avg_sq, grad);
  launch_async(device, kFusedAdamW, [param, exp_avg, exp_avg_sq, grad, h] {
    adamw_update(param, exp_avg, exp_avg_sq, grad, h);
  });
}

TORCH_LIBRARY_FRAGMENT(my_device, m) {
  m.def(
      "fused_adamw_(Tensor(a!) param, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, Tensor grad, *, float lr, "
      "float beta1, float beta2, float eps, float weight_decay, int step) -> ()");
}

TORCH_LIBRARY_IMPL(my_device, PrivateUse1, m) {
  m.impl("fused_adamw_", TORCH_FN(fused_adamw_mydev));
}

TORCH_LIBRARY_IMPL(my_device, CPU, m) {
  m.impl("fused_adamw_", TORCH_FN(fused_adamw_cpu));
}

TORCH_LIBRARY_IMPL(my_device, Meta, m) {
  m.impl("fused_adamw_", TORCH_FN(fused_adamw_meta));
}

} // namespace
} // namespace my_device::ops
