// cat as a queued structured kernel (StructuredKernel.h): a decoder's key and
// value caches grow by one cat a layer every token, and attention's q, k, v
// gradients join in one.
#include "StructuredKernel.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/cat_meta.h>
#include <ATen/ops/cat_native.h>
#include <torch/library.h>

#include <vector>

namespace my_device {

// cat's meta() returns what its impl() takes besides the inputs (the dim
// wrapped, the first input that is not a legacy empty one, whether all are
// contiguous and of one dtype, the output's memory format): kept here between
// the two, and copied into the queued job with the rest of meta()'s state.
// The inputs come as a vector, which a job can hold and alias (HostOperands).
struct Cat : at::native::structured_cat_out_cpu {
  void meta(const std::vector<at::Tensor>& tensors, int64_t dim) {
    plan = at::meta::structured_cat::meta(at::ITensorListRef(tensors), dim);
  }
  void impl(const std::vector<at::Tensor>& tensors, int64_t, const at::Tensor& out) {
    at::native::structured_cat_out_cpu::impl(at::ITensorListRef(tensors), plan.dim, plan.valid, plan.all_contiguous,
                                             plan.all_same_dtype, plan.all_same_sizes_and_stride, plan.memory_format,
                                             out);
  }
  meta_return_ty plan;
};

} // namespace my_device

namespace my_device::structured {
// Inputs of one floating dtype and rank, each contiguous (and not also
// channels-last) and not empty, that fit a short kernel: its
// impl() then copies them with memcpy or the CPU's serial loop (cat_serial_stub,
// called with kCPU), through their data pointers. Other calls may take a
// TensorIterator copy, whose stub is dispatched on the operands' device.
template <>
struct RunsOnDeviceTensors<my_device::Cat> : OnDeviceTensors {
  static bool accepts(const std::vector<at::Tensor>& tensors, int64_t) {
    for (const at::Tensor& t : tensors) {
      if (!at::isFloatingType(t.scalar_type()) || t.scalar_type() != tensors[0].scalar_type() || !t.is_contiguous() ||
          t.suggest_memory_format() != at::MemoryFormat::Contiguous || t.dim() != tensors[0].dim() || t.numel() == 0) {
        return false;
      }
    }
    return true;
  }
};
} // namespace my_device::structured

namespace my_device {
namespace {

using namespace structured;

at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim) {
  std::optional<c10::Device> common;
  c10::impl::check_and_update_common_device(common, tensors, "cat", "tensors");
  std::vector<at::Tensor> list;
  list.reserve(tensors.size());
  for (const at::Tensor& t : tensors) list.push_back(t);
  return functional<Cat>("aten::cat", list, dim);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("cat", TORCH_FN(cat));
}

} // namespace
} // namespace my_device
