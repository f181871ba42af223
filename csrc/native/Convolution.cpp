// Convolution. PyTorch routes convolutions on backends it does not know to
// convolution_overrideable / convolution_backward_overrideable, whose CPU
// kernels only raise, so the generic host kernel cannot serve them: these run
// PyTorch's CPU convolution on device memory explicitly.
//
// In the floating dtypes they are queued like other host kernels: the outputs
// are allocated at the call (the forward's geometry from the first run of its
// signature, at the call, where the CPU kernel also raises argument errors; the
// backward's gradients are shaped like input, weight and bias), and the CPU
// convolution runs on the worker and copies its results into them. The copy is
// the price of the CPU convolution having no out= form. Other dtypes run at the
// call.
#include <ATen/native/ConvUtils.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <c10/core/MemoryFormat.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <utility>

#include "Convolution.h"
#include "Factory.h"
#include "core/ComputeUnits.h"
#include "hostkernel/HostKernel.h"
#include "hostkernel/MetaCache.h"
#include "core/KernelArgs.h"
#include "core/Launch.h"

namespace my_device {
namespace {

// The dtypes the CPU convolution computes in (bf16/fp16 for autocast), so a
// queued convolution cannot fail on its dtype after the call returned.
bool queueable(const at::Tensor& input) {
  const auto t = input.scalar_type();
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// A dtype mix stays at the call, where the CPU kernel raises. Another device is rejected here, as
// CUDA rejects it, rather than read from the worker.
bool same_dtype_and_device(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  for (const at::Tensor* t : {&weight, bias.has_value() ? &*bias : nullptr}) {
    if (t == nullptr || !t->defined()) continue;
    TORCH_CHECK(t->device() == input.device(), "Expected all tensors to be on the same device, but found at least "
                "two devices, ", input.device(), " and ", t->device(), "!");
    if (t->scalar_type() != input.scalar_type()) return false;
  }
  return true;
}

// A convolution's multiply-adds: each element of its output (a transposed
// one's input) takes one per element of a filter.
int64_t convolution_work(const at::Tensor& input, const at::Tensor& weight, int64_t out_numel, bool transposed) {
  return (transposed ? input.numel() : out_numel) * (weight.numel() / std::max<int64_t>(1, weight.size(0)));
}

} // namespace

int convolution_sample_parts(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                             bool transposed, c10::IntArrayRef output_padding, int64_t groups, int64_t out_numel) {
  if (input.dim() != weight.dim()) return 1;
  const int parts =
      block_count(input.size(0), 1, convolution_work(input, weight, out_numel, transposed), kMinMultiplyAddsPerBlock);
  if (parts < 2) return 1;
  auto backend = [&](int64_t samples) {
    return at::native::select_conv_backend(
        input.narrow(0, 0, samples), weight, bias, c10::fromIntArrayRefSlow(stride),
        c10::fromIntArrayRefSlow(padding), c10::fromIntArrayRefSlow(dilation), transposed,
        c10::fromIntArrayRefSlow(output_padding), c10::SymInt(groups), std::nullopt);
  };
  const int64_t n = input.size(0);
  const auto whole = backend(n);
  for (int p = 0; p < parts; ++p) {
    if (backend(n * (p + 1) / parts - n * p / parts) != whole) return 1;
  }
  return parts;
}

namespace {

at::Tensor convolution_at_the_call(const at::Tensor& input, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                   c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                   c10::IntArrayRef output_padding, int64_t groups) {
  return run_on_host(input.device().index(), [&](HostCall& call) {
    return call.to_device(at::convolution(call.to_host(input), call.to_host(weight), call.to_host(bias), stride,
                                          padding, dilation, transposed, output_padding, groups));
  });
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  const c10::DeviceIndex device = input.device().index();
  // A call is queued once a call of its signature ran at the call (where the
  // CPU kernel checks the arguments), with that run's output geometry (the
  // CPU's layout: channels-last for a channels-last input or weight).
  const bool may_queue = same_dtype_and_device(input, weight, bias) && queueable(input);
  std::vector<c10::IValue> args;
  std::optional<std::vector<OutputSpec>> specs;
  if (may_queue) {
    args = {input, weight, bias, stride, padding, dilation, transposed, output_padding, groups};
    specs = known_outputs(op, args);
  }
  if (!specs) {
    // (A signature's first run waits for the stream, as a GPU would not: the
    // sync debug mode does not report it, as for host kernels.)
    std::optional<UnreportedSync> unreported;
    if (may_queue) unreported.emplace();
    at::Tensor out = convolution_at_the_call(input, weight, bias, stride, padding, dilation, transposed,
                                             output_padding, groups);
    if (may_queue) remember_outputs(op, args, {out});
    return out;
  }
  const OutputSpec& spec = specs->front();
  at::Tensor out = empty_device(spec.sizes, spec.strides, input.options().dtype(spec.dtype));
  KernelArgs held(device);
  std::optional<at::Tensor> held_bias;
  if (bias.has_value() && bias->defined()) held_bias = held.own(*bias);
  launch_async(device, "aten::convolution",
               [input = held.own(input), weight = held.own(weight), bias = std::move(held_bias),
                out = held.own(out), stride = stride.vec(), padding = padding.vec(), dilation = dilation.vec(),
                transposed, output_padding = output_padding.vec(), groups] {
                 HostCall call(out.device().index());
                 const at::Tensor host_input = call.to_host(input), host_weight = call.to_host(weight);
                 const at::Tensor host_out = call.to_host(out);
                 const std::optional<at::Tensor> host_bias = call.to_host(bias);
                 // A batch's samples are independent: a convolution big enough runs in blocks of samples on
                 // the device's compute units, each block with the whole batch's bits.
                 const int64_t n = host_input.size(0);
                 const int parts = convolution_sample_parts(host_input, host_weight, host_bias, stride, padding,
                                                            dilation, transposed, output_padding, groups, out.numel());
                 run_blocks(n, parts, [&](int64_t lo, int64_t samples) {
                   const bool whole = samples == n;  // (and an unbatched input's first dimension is its channels)
                   (whole ? host_out : host_out.narrow(0, lo, samples))
                       .copy_(at::convolution(whole ? host_input : host_input.narrow(0, lo, samples), host_weight,
                                              host_bias, stride, padding, dilation, transposed, output_padding,
                                              groups));
                 });
               });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  const std::vector<int64_t> bias_sizes{out_channels};
  const c10::DeviceIndex device = input.device().index();
  const bool same_dtype = grad_output.scalar_type() == input.scalar_type() &&
                          weight.scalar_type() == input.scalar_type();
  if (!queueable(input) || !same_dtype || grad_output.device() != input.device() ||
      weight.device() != input.device()) {
    return run_on_host(device, [&](HostCall& call) {
      auto [gi, gw, gb] = at::convolution_backward(call.to_host(grad_output), call.to_host(input),
                                                   call.to_host(weight), bias_sizes, stride, padding, dilation,
                                                   transposed, output_padding, groups, output_mask);
      return std::make_tuple(call.to_device(gi), call.to_device(gw), call.to_device(gb));
    });
  }
  // The gradients have the shapes of what they are gradients of, in the
  // memory format the CPU gives them (copy_ would take any other too).
  auto like = [&](c10::IntArrayRef sizes, bool wanted, c10::MemoryFormat format) {
    if (!wanted) return at::Tensor();
    std::vector<int64_t> strides;  // empty: contiguous
    if (format == c10::MemoryFormat::ChannelsLast) strides = c10::get_channels_last_strides_2d(sizes);
    if (format == c10::MemoryFormat::ChannelsLast3d) strides = c10::get_channels_last_strides_3d(sizes);
    return empty_device(sizes, strides, input.options());
  };
  at::Tensor gi = like(input.sizes(), output_mask[0], input.suggest_memory_format());
  at::Tensor gw = like(weight.sizes(), output_mask[1], weight.suggest_memory_format());
  at::Tensor gb = like(bias_sizes, output_mask[2], c10::MemoryFormat::Contiguous);
  KernelArgs held(device);
  auto own = [&](const at::Tensor& t) { return t.defined() ? held.own(t) : t; };
  launch_async(device, "aten::convolution_backward",
               [grad_output = held.own(grad_output), input = held.own(input), weight = held.own(weight),
                gi = own(gi), gw = own(gw), gb = own(gb), bias_sizes, stride = stride.vec(),
                padding = padding.vec(), dilation = dilation.vec(), transposed,
                output_padding = output_padding.vec(), groups, output_mask] {
                 HostCall call(input.device().index());
                 const at::Tensor host_grad = call.to_host(grad_output), host_input = call.to_host(input);
                 const at::Tensor host_weight = call.to_host(weight);
                 std::array<at::Tensor, 3> host_out;
                 for (auto [t, h] : {std::pair{&gi, &host_out[0]}, {&gw, &host_out[1]}, {&gb, &host_out[2]}}) {
                   if (t->defined()) *h = call.to_host(*t);
                 }
                 // The input's gradient and the weight's (with the bias's) are two calls of their own on two
                 // units, when both are asked for and each is work enough; each gets the whole call's bits.
                 const bool both = output_mask[0] && output_mask[1];  // (the bias's alone is a sum)
                 const int parts = both ? block_count(2, 1, 2 * convolution_work(input, weight, grad_output.numel(),
                                                                                 transposed),
                                                      kMinMultiplyAddsPerBlock)
                                        : 1;
                 run_blocks(2, parts, [&](int64_t first, int64_t count) {
                   std::array<bool, 3> mask = output_mask;
                   if (count == 1) mask = {first == 0 && mask[0], first == 1 && mask[1], first == 1 && mask[2]};
                   auto [hi, hw, hb] = at::convolution_backward(host_grad, host_input, host_weight, bias_sizes,
                                                                stride, padding, dilation, transposed, output_padding,
                                                                groups, mask);
                   for (auto [h, r] : {std::pair{&host_out[0], &hi}, {&host_out[1], &hw}, {&host_out[2], &hb}}) {
                     if (h->defined() && r->defined()) h->copy_(*r);
                   }
                 });
               });
  return std::make_tuple(gi, gw, gb);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
}

} // namespace
} // namespace my_device
