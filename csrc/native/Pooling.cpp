// Pooling: what mydev adds to the kernels PyTorch's composites reach.
#include <ATen/core/Tensor.h>
#include <ATen/ops/max_pool1d_native.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace my_device {
namespace {

// max_pool1d is a composite with two paths: the CPU's own (max_pool1d_impl,
// floating types only) and, on every other device, max_pool2d_with_indices.
// That kernel's CPU version, which mydev runs, takes integers too where CUDA's
// does not, so without this check mydev would pool integers the CPU refuses.
// The check sits on AutogradPrivateUse1, the first key a composite's call
// reaches; the composite then runs as it would have.
at::Tensor max_pool1d(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                      at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
  TORCH_CHECK_NOT_IMPLEMENTED(self.is_quantized() || at::isFloatingType(self.scalar_type()),
                              "\"max_pool1d_impl\" not implemented for '", toString(self.scalar_type()), "'");
  return at::native::max_pool1d(self, kernel_size, stride, padding, dilation, ceil_mode);
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("max_pool1d", TORCH_FN(max_pool1d));
}

} // namespace
} // namespace my_device
