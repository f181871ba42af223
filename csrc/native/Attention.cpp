// scaled_dot_product_attention: mydev picks its backend as the CPU does.
//
// at::scaled_dot_product_attention (CompositeImplicitAutograd) asks the
// device's _fused_sdp_choice_stub which backend to run and falls back to the
// math decomposition on devices without one. The math path rounds differently
// from the CPU's fused flash kernel (about 1e-5 in float32, a whole ulp or more
// in float16/bfloat16), so mydev would not match the CPU. With the CPU's choice
// in mydev's slot, SDPA calls _scaled_dot_product_flash_attention_for_cpu and
// its backward, which the host kernels (HostKernelOps.cpp) run on device
// memory like any other CPU op. A vendor with a fused attention kernel returns
// SDPBackend::overrideable here instead and registers
// _scaled_dot_product_fused_attention_overrideable.
#include "StructuredKernel.h"

#include <ATen/native/transformers/attention.h>

namespace my_device {
namespace {

const bool g_sdp_choice_mirrored = [] {
  structured::mirror_cpu_stub(at::native::_fused_sdp_choice_stub);
  return true;
}();

}  // namespace
}  // namespace my_device
