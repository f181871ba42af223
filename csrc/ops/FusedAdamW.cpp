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
#include <ATen/Parallel.h>

#include <cmath>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "OpSupport.h"
#include "core/KernelArgs.h"

namespace my_device::ops {
namespace {

constexpr char kFusedAdamW[] = "my_device::fused_adamw_";
// Elements per parallel task, as for aten's elementwise kernels (at::internal::GRAIN_SIZE).
constexpr int64_t kGrainSize = 32768;

struct AdamWStep {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
};

void check_inputs(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                  const at::Tensor& grad, const AdamWStep& h) {
  TORCH_CHECK(param.scalar_type() == at::kFloat || param.scalar_type() == at::kDouble, kFusedAdamW,
              ": param must be float32 or float64, got ", param.scalar_type());
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

template <class V>
struct Coefficients {
  V decay, step_size, one_minus_beta1, one_minus_beta2, beta2, eps, bias_correction2_sqrt;
};

template <class T>
Coefficients<T> coefficients(const AdamWStep& h) {
  const double step = static_cast<double>(h.step);
  auto c = [](double x) { return static_cast<T>(x); };
  return {c(1 - h.lr * h.weight_decay), c(h.lr / (1 - std::pow(h.beta1, step))), c(1 - h.beta1),
          c(1 - h.beta2), c(h.beta2), c(h.eps), c(std::sqrt(1 - std::pow(h.beta2, step)))};
}

inline float root(float x) {
  return std::sqrt(x);
}
inline double root(double x) {
  return std::sqrt(x);
}

// One element (or one group of SIMD lanes) of the update, with the same
// operations in the same order as torch.optim.AdamW's single-tensor step.
template <class V>
inline void adamw_element(V& param, V& exp_avg, V& exp_avg_sq, V grad, const Coefficients<V>& c) {
  param = param * c.decay;
  exp_avg = exp_avg + (grad - exp_avg) * c.one_minus_beta1;
  exp_avg_sq = exp_avg_sq * c.beta2 + c.one_minus_beta2 * grad * grad;
  const V denom = root(exp_avg_sq) / c.bias_correction2_sqrt + c.eps;
  param = param - c.step_size * exp_avg / denom;
}

template <class T>
void adamw_loop(T* param, T* exp_avg, T* exp_avg_sq, const T* grad, int64_t begin, int64_t end,
                const AdamWStep& h) {
  const Coefficients<T> c = coefficients<T>(h);
  for (int64_t i = begin; i < end; ++i) {
    adamw_element(param[i], exp_avg[i], exp_avg_sq[i], grad[i], c);
  }
}

#if defined(__SSE2__)
// GCC does not vectorise the loop above: the build keeps -fmath-errno, so each
// sqrt may call libm to set errno, and per-function optimize attributes do not
// lift that. float, the training dtype, therefore gets explicit 4-lane SSE2
// (baseline on x86-64), running the same adamw_element.
struct F32x4 {
  __m128 v;
};
inline F32x4 operator+(F32x4 a, F32x4 b) {
  return {_mm_add_ps(a.v, b.v)};
}
inline F32x4 operator-(F32x4 a, F32x4 b) {
  return {_mm_sub_ps(a.v, b.v)};
}
inline F32x4 operator*(F32x4 a, F32x4 b) {
  return {_mm_mul_ps(a.v, b.v)};
}
inline F32x4 operator/(F32x4 a, F32x4 b) {
  return {_mm_div_ps(a.v, b.v)};
}
inline F32x4 root(F32x4 a) {
  return {_mm_sqrt_ps(a.v)};
}

template <>
void adamw_loop<float>(float* param, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t begin,
                       int64_t end, const AdamWStep& h) {
  const Coefficients<float> c = coefficients<float>(h);
  auto splat = [](float x) { return F32x4{_mm_set1_ps(x)}; };
  const Coefficients<F32x4> cv{splat(c.decay), splat(c.step_size), splat(c.one_minus_beta1),
                               splat(c.one_minus_beta2), splat(c.beta2), splat(c.eps),
                               splat(c.bias_correction2_sqrt)};
  int64_t i = begin;
  for (; i + 4 <= end; i += 4) {
    F32x4 p{_mm_loadu_ps(param + i)}, m{_mm_loadu_ps(exp_avg + i)}, v{_mm_loadu_ps(exp_avg_sq + i)};
    adamw_element(p, m, v, F32x4{_mm_loadu_ps(grad + i)}, cv);
    _mm_storeu_ps(param + i, p.v);
    _mm_storeu_ps(exp_avg + i, m.v);
    _mm_storeu_ps(exp_avg_sq + i, v.v);
  }
  for (; i < end; ++i) {
    adamw_element(param[i], exp_avg[i], exp_avg_sq[i], grad[i], c);
  }
}
#endif

// Runs on whatever memory the tensors point at: host memory on CPU, device
// memory inside a mydev launch.
void adamw_update(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                  const at::Tensor& grad, const AdamWStep& h) {
  AT_DISPATCH_FLOATING_TYPES(param.scalar_type(), "fused_adamw_", [&] {
    // (kernel_address: identity for CPU tensors, which this also runs on)
    scalar_t* p = kernel_address(param.mutable_data_ptr<scalar_t>());
    scalar_t* m = kernel_address(exp_avg.mutable_data_ptr<scalar_t>());
    scalar_t* v = kernel_address(exp_avg_sq.mutable_data_ptr<scalar_t>());
    const scalar_t* g = kernel_address(grad.const_data_ptr<scalar_t>());
    at::parallel_for(0, param.numel(), kGrainSize,
                     [&](int64_t begin, int64_t end) { adamw_loop<scalar_t>(p, m, v, g, begin, end, h); });
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
  KernelArgs held(device);
  launch_async(device, kFusedAdamW, [param = held.own(param), exp_avg = held.own(exp_avg),
                                     exp_avg_sq = held.own(exp_avg_sq), grad = held.own(grad), h] {
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
