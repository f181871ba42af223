// Quantized tensors on mydev: per-tensor and per-channel affine, as CUDA has them.
//
// A quantized mydev tensor is PyTorch's own QTensorImpl (its quantizer maps the
// stored integers to reals) over device memory, under the QuantizedPrivateUse1
// key. Registered here: what touches no data, which is PyTorch's
// device-agnostic code (views, the quantizer's accessors, set_), and the
// factories, which PyTorch's new_qtensor cannot serve (it allocates for the
// CPU, CUDA and Meta only). Every op with a QuantizedCPU kernel, aten's and
// the quantized:: ops without packed weights, runs as a host kernel
// (hostkernel/Registration.cpp): HostCall hands the CPU kernel host aliases of
// the quantized operands, quantizers included, and adopts its quantized
// results. Those calls run at the call in stream order; none is queued, as no
// Meta kernel shapes a quantized result (MetaCache.cpp).
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_empty_per_channel_affine_quantized.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/empty_quantized_native.h>
#include <ATen/ops/empty_strided_native.h>
#include <ATen/ops/q_per_channel_axis_native.h>
#include <ATen/ops/q_per_channel_scales_native.h>
#include <ATen/ops/q_per_channel_zero_points_native.h>
#include <ATen/ops/q_scale_native.h>
#include <ATen/ops/q_zero_point_native.h>
#include <ATen/ops/qscheme_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/squeeze_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/unsqueeze_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include "core/Device.h"
#include "hostkernel/HostCall.h"
#include "Factory.h"

namespace my_device {
namespace {

struct QTensorArgs {
  c10::DeviceIndex device;
  c10::ScalarType dtype;
};

// The checks PyTorch's quantized factories make, with their messages.
QTensorArgs check_qtensor_args(std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                               std::optional<at::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(dtype.has_value(), "Must provide data type for Tensor creation functions.");
  TORCH_CHECK(c10::isQIntType(*dtype), "Creation of quantized tensor requires quantized dtype like torch.quint8");
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided, "mydev supports only strided tensors, got layout ",
              *layout);
  const c10::Device d = normalize(device.value_or(c10::Device(kMyDev)));
  check_device_index(d.index());
  return {d.index(), *dtype};
}

// Bytes of a quantized tensor: the sub-byte types pack 2 (quint4x2) or 4
// (quint2x4) values per byte along the innermost dimension, rows padded to a
// whole byte, as the CPU lays them out.
size_t qtensor_nbytes(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  const int64_t itemsize = static_cast<int64_t>(c10::elementSize(dtype));
  if (sizes.empty()) return itemsize;
  const int64_t per_byte = dtype == at::kQUInt4x2 ? 2 : dtype == at::kQUInt2x4 ? 4 : 1;
  const int64_t rows = c10::multiply_integers(sizes.begin(), sizes.end() - 1);
  return rows * ((sizes.back() * itemsize + per_byte - 1) / per_byte);
}

at::Tensor new_qtensor(c10::IntArrayRef sizes, const QTensorArgs& args, c10::MemoryFormat format,
                       at::QuantizerPtr quantizer) {
  at::detail::check_size_nonnegative(sizes);
  at::Tensor t = at::detail::make_tensor<at::QTensorImpl>(
      new_device_storage(args.device, qtensor_nbytes(sizes, args.dtype)),
      c10::DispatchKeySet(c10::DispatchKey::QuantizedPrivateUse1), c10::scalarTypeToTypeMeta(args.dtype),
      std::move(quantizer));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  t.unsafeGetTensorImpl()->empty_tensor_restride(format);
  return t;
}

at::Tensor empty_affine_quantized(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                  std::optional<at::Layout> layout, std::optional<at::Device> device,
                                  std::optional<bool> pin_memory, double scale, int64_t zero_point,
                                  std::optional<at::MemoryFormat> memory_format) {
  const QTensorArgs args = check_qtensor_args(dtype, layout, device, pin_memory);
  return new_qtensor(size, args, memory_format.value_or(at::MemoryFormat::Contiguous),
                     at::make_per_tensor_affine_quantizer(scale, zero_point, args.dtype));
}

at::Tensor empty_per_channel_affine_quantized(c10::IntArrayRef size, const at::Tensor& scales,
                                              const at::Tensor& zero_points, int64_t axis,
                                              std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                                              std::optional<at::Device> device, std::optional<bool> pin_memory,
                                              std::optional<at::MemoryFormat> memory_format) {
  // A quantizer's scales and zero points live where its tensor does (here
  // because of a mydev scales tensor, for a tensor of another device:
  // empty_quantized, from .cpu()).
  if (device.has_value() && device->type() != kMyDev) {
    return at::_empty_per_channel_affine_quantized(size, scales.to(*device), zero_points.to(*device), axis, dtype,
                                                   layout, device, pin_memory, memory_format);
  }
  const QTensorArgs args = check_qtensor_args(dtype, layout, device, pin_memory);
  const c10::Device on(kMyDev, args.device);
  return new_qtensor(size, args, memory_format.value_or(at::MemoryFormat::Contiguous),
                     at::make_per_channel_affine_quantizer(scales.to(on), zero_points.to(on), axis, args.dtype));
}

// torch.empty with a quantized dtype: no quantizer yet (a copy_ gives it one).
at::Tensor empty_unknown_quantized(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                   std::optional<at::Layout> layout, std::optional<at::Device> device,
                                   std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  const QTensorArgs args = check_qtensor_args(dtype, layout, device, pin_memory);
  return new_qtensor(size, args, memory_format.value_or(at::MemoryFormat::Contiguous),
                     at::make_unknown_quantizer(args.dtype));
}

// A copy with a quantized side (both on this device, or one on the CPU): the
// CPU's copy_ on host aliases, which quantizes a float source with dst's
// quantizer, or gives dst the source's quantizer and copies the integers.
at::Tensor copy_from_quantized(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  if (self.device().type() == kMyDev && dst.device().type() == kMyDev && self.device() != dst.device()) {
    return dst.copy_(self.cpu());
  }
  const c10::DeviceIndex device = (dst.device().type() == kMyDev ? dst : self).device().index();
  run_on_host(device, [&](HostCall& call) {
    call.to_host(dst).copy_(call.to_host(self));
    call.write_back();
    return true;
  });
  // A CPU dst took the source's quantizer, whose per-channel tensors were host
  // aliases of device memory for the copy's duration: it gets copies of its own.
  if (dst.device().type() != kMyDev && self.is_quantized() &&
      dynamic_cast<const at::PerChannelAffineQuantizer*>(self.quantizer().get()) != nullptr) {
    at::set_quantizer_(dst, at::make_per_channel_affine_quantizer(self.q_per_channel_scales().cpu(),
                                                                  self.q_per_channel_zero_points().cpu(),
                                                                  self.q_per_channel_axis(), dst.scalar_type()));
  }
  return dst;
}

at::Tensor squeeze_all(const at::Tensor& self) {
  return at::native::squeeze_quantized(self);
}
at::Tensor squeeze_dim(const at::Tensor& self, int64_t dim) {
  return at::native::squeeze_quantized(self, dim);
}
at::Tensor squeeze_dims(const at::Tensor& self, c10::IntArrayRef dims) {
  return at::native::squeeze_quantized(self, dims);
}

TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("_empty_affine_quantized", TORCH_FN(empty_affine_quantized));
  m.impl("_empty_per_channel_affine_quantized", TORCH_FN(empty_per_channel_affine_quantized));
  m.impl("empty.memory_format", TORCH_FN(empty_unknown_quantized));
  m.impl("empty_strided", TORCH_FN(at::native::empty_strided_unknown_quantized));  // raises, as on the CPU
  m.impl("empty_quantized", TORCH_FN(at::native::empty_quantized));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_quantized));
  m.impl("_copy_from", TORCH_FN(copy_from_quantized));
  // Views and metadata: PyTorch's code for quantized tensors of any device.
  m.impl("as_strided", TORCH_FN(at::native::as_strided_qtensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("squeeze", TORCH_FN(squeeze_all));
  m.impl("squeeze.dim", TORCH_FN(squeeze_dim));
  m.impl("squeeze.dims", TORCH_FN(squeeze_dims));
  m.impl("unsqueeze", TORCH_FN(at::native::unsqueeze_quantized));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(at::native::set_storage_quantized_));
  m.impl("q_scale", TORCH_FN(at::native::q_scale_quant));
  m.impl("q_zero_point", TORCH_FN(at::native::q_zero_point_quant));
  m.impl("qscheme", TORCH_FN(at::native::qscheme_quant));
  m.impl("q_per_channel_scales", TORCH_FN(at::native::q_per_channel_scales));
  m.impl("q_per_channel_zero_points", TORCH_FN(at::native::q_per_channel_zero_points));
  m.impl("q_per_channel_axis", TORCH_FN(at::native::q_per_channel_axis));
}

// Called with a dense dtype, the quantized factories reach the dense key; the
// CPU's raise there, as these do.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_empty_affine_quantized", TORCH_FN(empty_affine_quantized));
  m.impl("_empty_per_channel_affine_quantized", TORCH_FN(empty_per_channel_affine_quantized));
}

} // namespace
} // namespace my_device
