// torch.autocast("mydev") rules for the my_device:: custom operators, chosen
// as CUDA's table treats the aten ops each one stands for:
//   fused_linear_gelu  lower_precision_fp  (a linear, which CUDA runs in the
//                                          autocast dtype, then an activation)
//   rms_norm           fp32                (aten::rms_norm, like every norm, is
//                                          in CUDA's float32 list)
//   swiglu             promote             (elementwise on two inputs that must
//                                          share a dtype: run in the widest)
// Not listed, so falling through and running at their inputs' dtypes:
//   rms_norm_backward, gelu_backward: backward ops, called by autograd outside
//     the autocast region with the dtypes the forward saved;
//   fused_adamw_: an in-place optimizer update, whose dtypes are those of the
//     parameters and their state; casting would update copies.
//
// The policies are PyTorch's own WrapFunction templates (ATen/autocast_mode.h),
// the ones aten ops use, redispatching through the op's dispatcher handle.
// swiglu is defined in Python (my_device/ops.py) after this library loads;
// the dispatcher accepts a kernel for an op whose schema comes later, and
// checks this kernel's signature against it then.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace my_device::amp {
namespace {

using FusedLinearGeluSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&);
using RmsNormSig = at::Tensor(const at::Tensor&, const at::Tensor&, double);
using SwigluSig = at::Tensor(const at::Tensor&, const at::Tensor&);

template <class Signature>
c10::TypedOperatorHandle<Signature> handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

at::Tensor call_fused_linear_gelu(const at::Tensor& input, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias) {
  static const auto op = handle<FusedLinearGeluSig>("my_device::fused_linear_gelu");
  return op.call(input, weight, bias);
}

at::Tensor call_rms_norm(const at::Tensor& input, const at::Tensor& weight, double eps) {
  static const auto op = handle<RmsNormSig>("my_device::rms_norm");
  return op.call(input, weight, eps);
}

at::Tensor call_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  static const auto op = handle<SwigluSig>("my_device::swiglu");
  return op.call(gate, up);
}

template <at::autocast::CastPolicy policy, class Signature, Signature* redispatch>
constexpr auto autocast_kernel() {
  return &at::autocast::WrapFunction<policy, c10::DeviceType::PrivateUse1, Signature, Signature,
                                     redispatch>::type::call;
}

} // namespace

TORCH_LIBRARY_IMPL(my_device, AutocastPrivateUse1, m) {
  using at::autocast::CastPolicy;
  m.impl("fused_linear_gelu",
         autocast_kernel<CastPolicy::lower_precision_fp, FusedLinearGeluSig, &call_fused_linear_gelu>());
  m.impl("rms_norm", autocast_kernel<CastPolicy::fp32, RmsNormSig, &call_rms_norm>());
  m.impl("swiglu", autocast_kernel<CastPolicy::promote, SwigluSig, &call_swiglu>());
}

} // namespace my_device::amp
