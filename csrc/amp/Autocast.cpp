// torch.autocast("mydev"): the AutocastPrivateUse1 kernels of aten ops.
//
// mydev takes CUDA's policy, op for op. PyTorch publishes CUDA's op lists as
// macros in ATen/autocast_mode.h (AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
// ...) so that other backends register the same table, and its WrapFunction
// templates implement each policy (cast to the autocast dtype, to float32, to
// the widest input type, or set/append a float32 output dtype), with the same
// weight-cast cache CUDA uses. Registering those lists here keeps mydev in
// step with CUDA whenever PyTorch changes them; test_amp.py checks that the set
// of ops with an AutocastPrivateUse1 kernel is exactly the set with an
// AutocastCUDA one (less the cuDNN-only ops), and the dtypes each policy gives.
//
// Every other op falls through: it runs at its inputs' dtypes, as under CUDA.
// The autocast dtype defaults to float16 for PrivateUse1 in PyTorch, as for
// CUDA; bfloat16 works through the same kernels (`dtype=torch.bfloat16`).
//
// The my_device:: custom ops get their rules in AutocastCustomOps.cpp.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace my_device::amp {
namespace {

// As under CUDA autocast: binary_cross_entropy on a float16 sigmoid output
// loses its precision where it matters, so autocast refuses it and points to
// the fused, safe-to-autocast variant. The first line is CUDA's message.
at::Tensor binary_cross_entropy_refused(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                       int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "A sigmoid followed by binary cross entropy loses precision in float16 and bfloat16; use "
              "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, which "
              "autocast runs in float32 (or run this loss outside the autocast region, on float32 inputs).");
}

} // namespace

// AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE spells its signatures with these
// names unqualified, as inside namespace at.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  // Without a kernel for this key the first op under autocast would fail
  // ("Could not run 'aten::t' ... 'Autocastmydev'"); ops with no policy run
  // at their inputs' dtypes.
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define MYDEV_AUTOCAST_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define MYDEV_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define MYDEV_AUTOCAST_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define MYDEV_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

  AT_FORALL_LOWER_PRECISION_FP(MYDEV_AUTOCAST_LOWER_PRECISION_FP)
  AT_FORALL_FP32(MYDEV_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(MYDEV_AUTOCAST_FP32_SET_OPT_DTYPE)
  // norm's overloads without an output dtype are redispatched to the ones with one, given float32.
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(MYDEV_AUTOCAST_PROMOTE)

#undef MYDEV_AUTOCAST_LOWER_PRECISION_FP
#undef MYDEV_AUTOCAST_FP32
#undef MYDEV_AUTOCAST_FP32_SET_OPT_DTYPE
#undef MYDEV_AUTOCAST_PROMOTE

  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_refused));
}

} // namespace my_device::amp
