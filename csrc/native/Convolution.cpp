// Convolution. PyTorch routes convolutions on backends it does not know to
// convolution_overrideable / convolution_backward_overrideable, whose CPU
// kernels only raise, so the generic host kernel cannot serve them: these run
// PyTorch's CPU convolution on device memory explicitly.
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <torch/library.h>

#include "HostKernel.h"

namespace my_device {
namespace {

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  return run_on_host(input.device().index(), [&](HostCall& call) {
    return call.to_device(at::convolution(call.to_host(input), call.to_host(weight), call.to_host(bias), stride,
                                          padding, dilation, transposed, output_padding, groups));
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  const std::vector<int64_t> bias_sizes{out_channels};
  return run_on_host(input.device().index(), [&](HostCall& call) {
    auto [gi, gw, gb] = at::convolution_backward(call.to_host(grad_output), call.to_host(input),
                                                 call.to_host(weight), bias_sizes, stride, padding, dilation,
                                                 transposed, output_padding, groups, output_mask);
    return std::make_tuple(call.to_device(gi), call.to_device(gw), call.to_device(gb));
  });
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
}

} // namespace
} // namespace my_device
