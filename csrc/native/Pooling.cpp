// Pooling: what mydev adds to the kernels PyTorch's composites reach, and
// max pooling's queued kernels shared among the compute units.
#include "StructuredKernel.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/max_pool1d_native.h>
#include <ATen/ops/max_pool2d_with_indices_backward_native.h>
#include <ATen/ops/max_pool2d_with_indices_native.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include "core/ComputeUnits.h"

namespace my_device::structured {

// A batch's samples pool independently: a queued max pooling big enough runs
// in blocks of samples shared among the device's compute units (the CPU's loop
// parallelises over planes, which at one intra-op thread left the second core
// idle: 2.6x the CPU's time on a (8, 16, 32, 32) input at two threads). An
// unbatched input (C, H, W) runs whole.
int sample_parts(const at::Tensor& input) {
  return input.dim() == 4 ? block_count(input.size(0), 1, input.numel(), kMinPooledPerBlock) : 1;
}

struct max_pool2d_in_sample_blocks : at::native::structured_max_pool2d_with_indices_out_cpu {
  void impl(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
            at::IntArrayRef dilation, bool ceil_mode, const at::Tensor& out, const at::Tensor& indices) {
    run_blocks(self.size(0), sample_parts(self), [&](int64_t lo, int64_t n) {
      structured_max_pool2d_with_indices_out_cpu::impl(self.narrow(0, lo, n), kernel_size, stride, padding, dilation,
                                                       ceil_mode, out.narrow(0, lo, n), indices.narrow(0, lo, n));
    });
  }
};

struct max_pool2d_backward_in_sample_blocks : at::native::structured_max_pool2d_with_indices_backward_out_cpu {
  void impl(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
            at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode, const at::Tensor& indices,
            const at::Tensor& grad_input) {
    run_blocks(self.size(0), sample_parts(self), [&](int64_t lo, int64_t n) {
      structured_max_pool2d_with_indices_backward_out_cpu::impl(
          grad_output.narrow(0, lo, n), self.narrow(0, lo, n), kernel_size, stride, padding, dilation, ceil_mode,
          indices.narrow(0, lo, n), grad_input.narrow(0, lo, n));
    });
  }
};

} // namespace my_device::structured

namespace my_device {
namespace {

using namespace structured;

// A queued kernel's job keeps its arguments: list arguments by value.
using Ints = c10::SmallVector<int64_t, 2>;
Ints held(at::IntArrayRef list) {
  return Ints(list.begin(), list.end());
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(const at::Tensor& self, at::IntArrayRef kernel_size,
                                                           at::IntArrayRef stride, at::IntArrayRef padding,
                                                           at::IntArrayRef dilation, bool ceil_mode) {
  return functional_tuple<max_pool2d_in_sample_blocks, 2>("aten::max_pool2d_with_indices", self, held(kernel_size),
                                                          held(stride), held(padding), held(dilation), ceil_mode);
}

at::Tensor max_pool2d_with_indices_backward(const at::Tensor& grad_output, const at::Tensor& self,
                                            at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                            at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                                            const at::Tensor& indices) {
  check_same_device("max_pool2d_with_indices_backward",
                    {{"grad_output", grad_output}, {"self", self}, {"indices", indices}});
  return functional<max_pool2d_backward_in_sample_blocks>("aten::max_pool2d_with_indices_backward", grad_output,
                                                          self, held(kernel_size), held(stride), held(padding),
                                                          held(dilation), ceil_mode, indices);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("max_pool2d_with_indices", TORCH_FN(max_pool2d_with_indices));
  m.impl("max_pool2d_with_indices_backward", TORCH_FN(max_pool2d_with_indices_backward));
}

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
