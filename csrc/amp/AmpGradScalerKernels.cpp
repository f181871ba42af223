// GradScaler's two device ops on mydev, queued on the current stream:
//   _amp_foreach_non_finite_check_and_unscale_  (GradScaler.unscale_)
//   _amp_update_scale_                           (GradScaler.update)
//
// Both only write tensors the caller already holds (the gradients in place, a
// 1-element found_inf, the scale and growth tracker), so nothing has to be
// known on the host when they return: as with CUDA's kernels, an optimizer
// iteration with GradScaler waits for the device only where GradScaler itself
// reads a value (`found_inf.item()` in step()). Run as host kernels at the call
// instead, each would wait for the whole backward pass to drain.
//
// Arguments are checked at the call, where CUDA checks them too, so a bad
// call raises there and queues nothing. The queued body is PyTorch's CPU
// kernel for the op, pointed at the device bytes.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale_cpu_dispatch.h>
#include <ATen/ops/_amp_update_scale_cpu_dispatch.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "core/KernelArgs.h"
#include "core/Launch.h"
#include "native/hostkernel/HostKernel.h"

namespace my_device::amp {
namespace {

constexpr char kUnscale[] = "aten::_amp_foreach_non_finite_check_and_unscale_";
constexpr char kUpdateScale[] = "aten::_amp_update_scale_";

// `dtype_word` as in CUDA's messages: "a float tensor", "an int tensor".
void check_scalar(const at::Tensor& t, const char* name, at::ScalarType dtype, const char* dtype_word,
                  const at::Device& device) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, name, " must be a mydev tensor.");
  TORCH_CHECK(t.device() == device, name, " must be on ", device, ", the device of the other arguments, but is on ",
              t.device(), ".");
  TORCH_CHECK(t.numel() == 1, name, " must be a 1-element tensor.");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype_word, " tensor.");
}

void non_finite_check_and_unscale(at::TensorList scaled_grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  if (scaled_grads.empty()) {
    return;
  }
  const at::Device device = found_inf.device();
  check_scalar(found_inf, "found_inf", at::kFloat, "a float", device);
  check_scalar(inv_scale, "inv_scale", at::kFloat, "a float", device);
  for (const at::Tensor& g : scaled_grads) {
    TORCH_CHECK(g.device() == device, "one of scaled_grads is on ", g.device(), ", not on found_inf's device ", device,
                ".");
    TORCH_CHECK(g.layout() == at::kStrided, "one of scaled_grads was not a strided tensor.");
    TORCH_CHECK(at::isFloatingType(g.scalar_type()), "one of scaled_grads has dtype ", g.scalar_type(),
                "; expected float32, float64, float16 or bfloat16.");
  }
  KernelArgs held(device.index());
  std::vector<at::Tensor> grads;
  grads.reserve(scaled_grads.size());
  for (const at::Tensor& g : scaled_grads) {
    grads.push_back(held.own(g));
  }
  launch_async(device.index(), kUnscale,
               [grads = std::move(grads), found_inf = held.own(found_inf), inv_scale = held.own(inv_scale)] {
                 HostCall call(found_inf.device().index());
                 std::vector<at::Tensor> host_grads;
                 host_grads.reserve(grads.size());
                 for (const at::Tensor& g : grads) {
                   host_grads.push_back(call.to_host(g));
                 }
                 at::Tensor host_found_inf = call.to_host(found_inf);
                 at::cpu::_amp_foreach_non_finite_check_and_unscale_(host_grads, host_found_inf,
                                                                    call.to_host(inv_scale));
               });
}

at::Tensor& update_scale(at::Tensor& current_scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                         double growth_factor, double backoff_factor, int64_t growth_interval) {
  const at::Device device = current_scale.device();
  check_scalar(current_scale, "current_scale", at::kFloat, "a float", device);
  check_scalar(growth_tracker, "growth_tracker", at::kInt, "an int", device);
  check_scalar(found_inf, "found_inf", at::kFloat, "a float", device);
  KernelArgs held(device.index());
  launch_async(device.index(), kUpdateScale,
               [scale = held.own(current_scale), tracker = held.own(growth_tracker), found_inf = held.own(found_inf),
                growth_factor, backoff_factor, growth_interval] {
                 HostCall call(scale.device().index());
                 at::Tensor host_scale = call.to_host(scale);
                 at::Tensor host_tracker = call.to_host(tracker);
                 at::cpu::_amp_update_scale_(host_scale, host_tracker, call.to_host(found_inf), growth_factor,
                                             backoff_factor, growth_interval);
               });
  return current_scale;
}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_amp_foreach_non_finite_check_and_unscale_", TORCH_FN(non_finite_check_and_unscale));
  m.impl("_amp_update_scale_", TORCH_FN(update_scale));
}

} // namespace my_device::amp
