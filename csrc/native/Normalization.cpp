// Layer norm (forward and backward) as queued kernels, through the structured
// kernel path (StructuredKernel.h): its checks and output allocation run at the
// call, its loop is the CPU's LayerNorm stubs, and a short call on an idle
// stream runs at once over the caller's tensors. Every transformer block calls
// it twice; as a generic host kernel (a signature, a plan, three outputs
// copied out of a CPU result) a decoding step's (1, 1, 128) layer norm cost
// three times the CPU's call.
//
// ATen has no structured kernel for layer norm, so the two classes below give
// the CPU's layer_norm_cpu and layer_norm_backward_cpu that shape: meta() makes
// the CPU's checks and declares the CPU's outputs, impl() calls the stub.
#include "StructuredKernel.h"

#include <ATen/TensorUtils.h>
#include <ATen/native/cpu/mixed_data_type.h>
#include <ATen/native/layer_norm.h>
#include <torch/library.h>

#include <array>
#include <tuple>

namespace my_device {
namespace {

using namespace structured;

using Shape = c10::SmallVector<int64_t, 4>;

// The dtypes the CPU's LayerNorm stubs have loops for. Other calls (integer or
// complex inputs) go to the host kernel, whose first call of a signature runs
// at the call, so the CPU kernel's "not implemented" error comes there.
bool has_loop(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// The shape of mean and rstd: the input's outer dimensions, 1 for each
// normalized one. The CPU views its (M,) statistics with it; these strides are
// that view's.
std::pair<Shape, Shape> stat_geometry(const at::Tensor& input, size_t normalized_ndim, int64_t M) {
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_ndim);
  Shape sizes;
  for (int64_t d = 0; d < input.dim(); ++d) sizes.push_back(d < axis ? input.size(d) : 1);
  const int64_t flat_size[] = {M};
  const int64_t flat_stride[] = {1};
  const auto strides = at::detail::computeStride(at::IntArrayRef(flat_size), at::IntArrayRef(flat_stride),
                                                 at::IntArrayRef(sizes));
  TORCH_INTERNAL_ASSERT(strides.has_value());
  return {sizes, Shape(strides->begin(), strides->end())};
}

// (M, N): the rows the statistics are taken over and their length. (A queued
// impl() runs on an object meta() never saw: it keeps nothing between them.)
std::pair<int64_t, int64_t> rows_and_cols(const at::Tensor& input, const Shape& normalized_shape) {
  const auto sizes = input.sizes();
  const size_t axis = sizes.size() - normalized_shape.size();
  return {c10::multiply_integers(sizes.begin(), sizes.begin() + axis),
          c10::multiply_integers(sizes.begin() + axis, sizes.end())};
}

// The CPU's checks, in its order: parameter dtypes, then shapes.
std::pair<int64_t, int64_t> check_inputs(const char* op, const at::Tensor& input, const Shape& normalized_shape,
                                         const at::Tensor& weight, const at::Tensor& bias) {
  check_same_device(op, {{"input", input}, {"weight", weight}, {"bias", bias}});
  if (at::native::is_mixed_type(input, weight, bias)) at::native::check_mixed_data_type(input, weight, bias);
  return at::native::_check_layer_norm_inputs(input, normalized_shape, weight, bias);
}

struct LayerNormForward : at::impl::MetaBase {
  void meta(const at::Tensor& input, const Shape& normalized_shape, const HeldOptionalTensor& weight,
            const HeldOptionalTensor& bias, double) {
    const int64_t M = check_inputs("native_layer_norm", input, normalized_shape, weight.tensor(), bias.tensor()).first;
    const auto stat_dtype =
        at::native::param_scalar_type(input, at::native::is_mixed_type(input, weight.tensor(), bias.tensor()));
    set_output_raw_strided(0, input.sizes(), c10::contiguous_strides(input.sizes()), input.options());
    const auto [sizes, strides] = stat_geometry(input, normalized_shape.size(), M);
    set_output_raw_strided(1, sizes, strides, input.options().dtype(stat_dtype));
    set_output_raw_strided(2, sizes, strides, input.options().dtype(stat_dtype));
  }
  void impl(const at::Tensor& input, const Shape& normalized_shape, const HeldOptionalTensor& weight,
            const HeldOptionalTensor& bias, double eps, const at::Tensor& out, const at::Tensor& mean,
            const at::Tensor& rstd) {
    const auto [rows, cols] = rows_and_cols(input, normalized_shape);
    const auto X = input.expect_contiguous();
    const auto gamma = weight.tensor().expect_contiguous();
    const auto beta = bias.tensor().expect_contiguous();
    at::Tensor Y = out, mean_out = mean, rstd_out = rstd;
    at::native::LayerNormKernel(at::kCPU, *X, *gamma, *beta, rows, cols, eps, &Y, &mean_out, &rstd_out);
  }
};

struct LayerNormBackward : at::impl::MetaBase {
  void meta(const at::Tensor& grad_out, const at::Tensor& input, const Shape& normalized_shape, const at::Tensor& mean,
            const at::Tensor& rstd, const HeldOptionalTensor& weight, const HeldOptionalTensor& bias,
            std::array<bool, 3> mask) {
    check_same_device("native_layer_norm_backward",
                      {{"grad_out", grad_out}, {"input", input}, {"mean", mean}, {"rstd", rstd}});
    check_inputs("native_layer_norm_backward", input, normalized_shape, weight.tensor(), bias.tensor());
    if (mask[0]) set_output_raw_strided(0, input.sizes(), c10::contiguous_strides(input.sizes()), input.options());
    if (mask[1]) {
      const at::Tensor& w = weight.tensor();
      set_output_raw_strided(1, w.sizes(), c10::contiguous_strides(w.sizes()), w.options());
    }
    if (mask[2]) {
      const at::Tensor& b = bias.tensor();
      set_output_raw_strided(2, b.sizes(), c10::contiguous_strides(b.sizes()), b.options());
    }
  }
  void impl(const at::Tensor& grad_out, const at::Tensor& input, const Shape& normalized_shape, const at::Tensor& mean,
            const at::Tensor& rstd, const HeldOptionalTensor& weight, const HeldOptionalTensor&, std::array<bool, 3>,
            const at::Tensor& grad_input, const at::Tensor& grad_weight, const at::Tensor& grad_bias) {
    const auto [rows, cols] = rows_and_cols(input, normalized_shape);
    const auto X = input.expect_contiguous();
    const auto gamma = weight.tensor().expect_contiguous();
    at::Tensor dX = grad_input, dgamma = grad_weight, dbeta = grad_bias;
    at::native::LayerNormBackwardKernel(at::kCPU, grad_out, *X, mean, rstd, *gamma, rows, cols, &dX, &dgamma,
                                        &dbeta);
  }
};

} // namespace
} // namespace my_device

namespace my_device::structured {
// Both impl()s reach their operands through data pointers and
// expect_contiguous(), whose copy of a strided input runs nested, at once.
template <>
struct RunsOnDeviceTensors<LayerNormForward> : OnDeviceTensors {};
template <>
struct RunsOnDeviceTensors<LayerNormBackward> : OnDeviceTensors {};
} // namespace my_device::structured

namespace my_device {
namespace {

bool queueable(const at::Tensor& input, const std::optional<at::Tensor>& weight,
               const std::optional<at::Tensor>& bias) {
  auto ok = [](const std::optional<at::Tensor>& t) { return !t || !t->defined() || has_loop(t->scalar_type()); };
  return input.numel() > 0 && has_loop(input.scalar_type()) && ok(weight) && ok(bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                          const std::optional<at::Tensor>& weight,
                                                          const std::optional<at::Tensor>& bias, double eps) {
  constexpr const char* kLabel = "aten::native_layer_norm";
  if (!queueable(input, weight, bias)) {
    auto out = run_host_kernel(kLabel, input, normalized_shape, weight, bias, eps);
    return {out[0].toTensor(), out[1].toTensor(), out[2].toTensor()};
  }
  return functional_tuple<LayerNormForward, 3>(kLabel, input, Shape(normalized_shape.begin(), normalized_shape.end()),
                                               HeldOptionalTensor(weight), HeldOptionalTensor(bias), eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 3> mask) {
  constexpr const char* kLabel = "aten::native_layer_norm_backward";
  // (An empty input's parameter gradients are zeros, which the CPU fills
  // outside its stub: the host kernel serves that call.)
  const bool params_defined = (!mask[1] || (weight && weight->defined())) && (!mask[2] || (bias && bias->defined()));
  if (!queueable(input, weight, bias) || !has_loop(grad_out.scalar_type()) || !params_defined) {
    auto out = run_host_kernel(kLabel, grad_out, input, normalized_shape, mean, rstd, weight, bias, mask);
    return {out[0].toTensor(), out[1].toTensor(), out[2].toTensor()};
  }
  return functional_tuple<LayerNormBackward, 3>(kLabel, grad_out, input,
                                                Shape(normalized_shape.begin(), normalized_shape.end()), mean, rstd,
                                                HeldOptionalTensor(weight), HeldOptionalTensor(bias), mask);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_layer_norm", TORCH_FN(layer_norm));
  m.impl("native_layer_norm_backward", TORCH_FN(layer_norm_backward));
}

} // namespace
} // namespace my_device
