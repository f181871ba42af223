// View ops. A view must share its base's storage and be a MyDevTensorImpl, so
// none of these may go through a fallback (which would return a copy) or
// through PyTorch's CPU view helpers (which build a plain TensorImpl). Most
// other views (transpose, slice, select, expand, permute, narrow, squeeze,
// diagonal, ...) are composite and funnel into as_strided here.
#include <ATen/InferSize.h>
#include <ATen/TensorUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/unfold_native.h>
#include <torch/library.h>

#include "core/TensorImpl.h"

namespace my_device {
namespace {

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  const int64_t offset = storage_offset.value_or(self.storage_offset());
  at::native::checkInBoundsForStorage(size, stride, offset, self.dtype(), self.storage());
  return make_view(self, size, stride, offset);
}

const at::Tensor& as_strided_(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                              std::optional<int64_t> storage_offset) {
  at::native::setStrided(self, size, stride, storage_offset.value_or(self.storage_offset()));
  return self;
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  const auto inferred = at::infer_size_dv(size, self.numel());
  const auto stride = at::detail::computeStride(self.sizes(), self.strides(), inferred);
  TORCH_CHECK(stride.has_value(),
              "view size is not compatible with input tensor's size and stride (at least one dimension"
              " spans across two contiguous subspaces). Use .reshape(...) instead.");
  return make_view(self, inferred, *stride, self.storage_offset());
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return make_view(self, size, stride, self.storage_offset());
}

at::Tensor alias_view(const at::Tensor& self) {
  return make_view(self, self.sizes(), self.strides(), self.storage_offset());
}

// Reinterpreting bytes as another dtype: sizes and strides scale by the ratio
// of element sizes along the last, contiguous dimension.
at::Tensor view_dtype(const at::Tensor& self, at::ScalarType dtype) {
  const auto new_meta = c10::scalarTypeToTypeMeta(dtype);
  if (self.scalar_type() == dtype) return alias_view(self);
  TORCH_CHECK(!self.is_conj(), "torch.Tensor.view is not supported for conjugate view tensors when"
              " converting to a different dtype.");
  TORCH_CHECK(!self.is_neg(), "torch.Tensor.view is not supported for tensors with negative bit set"
              " when converting to a different dtype.");
  const int64_t self_size = static_cast<int64_t>(self.element_size());
  const int64_t new_size = static_cast<int64_t>(new_meta.itemsize());
  if (self_size == new_size) {
    return make_view(self, self.sizes(), self.strides(), self.storage_offset(), new_meta);
  }
  TORCH_CHECK(self.dim() > 0, "self.dim() cannot be 0 to view ", self.scalar_type(), " as ", dtype,
              " (different element sizes)");
  TORCH_CHECK(self.stride(-1) == 1, "self.stride(-1) must be 1 to view ", self.scalar_type(), " as ", dtype,
              " (different element sizes), but got ", self.stride(-1));
  auto sizes = self.sizes().vec();
  auto strides = self.strides().vec();
  int64_t offset = self.storage_offset();
  const int64_t last = self.dim() - 1;
  if (self_size > new_size) {
    const int64_t ratio = self_size / new_size;
    sizes[last] *= ratio;
    for (int64_t i = 0; i < last; ++i) strides[i] *= ratio;
    offset *= ratio;
  } else {
    const int64_t ratio = new_size / self_size;
    TORCH_CHECK(sizes[last] % ratio == 0, "self.size(-1) must be divisible by ", ratio, " to view ",
                self.scalar_type(), " as ", dtype, " (different element sizes), but got ", sizes[last]);
    TORCH_CHECK(offset % ratio == 0, "self.storage_offset() must be divisible by ", ratio, " to view ",
                self.scalar_type(), " as ", dtype, " (different element sizes), but got ", offset);
    for (int64_t i = 0; i < last; ++i) {
      TORCH_CHECK(strides[i] % ratio == 0, "self.stride(", i, ") must be divisible by ", ratio, " to view ",
                  self.scalar_type(), " as ", dtype, " (different element sizes), but got ", strides[i]);
      strides[i] /= ratio;
    }
    sizes[last] /= ratio;
    offset /= ratio;
  }
  return make_view(self, sizes, strides, offset, new_meta);
}

at::Tensor view_as_real(const at::Tensor& self) {
  TORCH_CHECK(!self.is_conj(), "view_as_real doesn't work on unresolved conjugated tensors.  To resolve the"
              " conjugate tensor so you can view it as real, use self.resolve_conj()");
  TORCH_CHECK(self.is_complex(), "view_as_real is only supported for complex tensors");
  auto sizes = self.sizes().vec();
  sizes.push_back(2);
  auto strides = self.strides().vec();
  for (auto& s : strides) s *= 2;
  strides.push_back(1);
  const auto real = c10::scalarTypeToTypeMeta(c10::toRealValueType(self.scalar_type()));
  return make_view(self, sizes, strides, self.storage_offset() * 2, real);
}

at::Tensor view_as_complex(const at::Tensor& self) {
  const auto t = self.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf,
              "view_as_complex is only supported for half, float and double tensors, but got a tensor of"
              " scalar type: ", t);
  TORCH_CHECK(self.dim() != 0, "Input tensor must have one or more dimensions");
  TORCH_CHECK(self.size(-1) == 2, "Tensor must have a last dimension of size 2");
  TORCH_CHECK(self.stride(-1) == 1, "Tensor must have a last dimension with stride 1");
  auto sizes = self.sizes().vec();
  sizes.pop_back();
  auto strides = self.strides().vec();
  strides.pop_back();
  for (auto s : strides) TORCH_CHECK(s % 2 == 0, "Tensor must have a stride divisible by 2 for all but last dimension");
  TORCH_CHECK(self.storage_offset() % 2 == 0, "Tensor must have a storage_offset divisible by 2");
  for (auto& s : strides) s /= 2;
  const auto complex = c10::scalarTypeToTypeMeta(c10::toComplexType(t));
  return make_view(self, sizes, strides, self.storage_offset() / 2, complex);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("as_strided_", TORCH_FN(as_strided_));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("alias", TORCH_FN(alias_view));
  m.impl("view.dtype", TORCH_FN(view_dtype));
  m.impl("view_as_real", TORCH_FN(view_as_real));
  m.impl("view_as_complex", TORCH_FN(view_as_complex));
  // PyTorch's unfold builds its result with as_strided, which is ours.
  m.impl("unfold", TORCH_FN(at::native::unfold));
}

} // namespace
} // namespace my_device
