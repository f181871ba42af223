// Tensor creation: every mydev tensor starts here as a MyDevTensorImpl.
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/TensorFactories.h>
#include <c10/core/TensorOptions.h>
#include <torch/library.h>

#include "core/Allocator.h"
#include "core/Device.h"
#include "core/TensorImpl.h"
#include "Factory.h"

namespace my_device {
namespace {

struct NewTensorArgs {
  c10::Device device;
  caffe2::TypeMeta dtype;
};

NewTensorArgs check_new_tensor(std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                               std::optional<at::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
  const auto l = layout.value_or(at::kStrided);
  TORCH_CHECK(l == at::kStrided, "mydev supports only strided tensors, got layout ", l);
  const at::ScalarType type = dtype.value_or(c10::get_default_dtype_as_scalartype());
  if (type == at::kComplexHalf) {
    // The warning CPU and CUDA tensors give (their empty kernels share it).
    TORCH_WARN_ONCE("ComplexHalf support is experimental and many operators don't support it yet.");
  }
  return {normalize(device.value_or(c10::Device(kMyDev))), c10::scalarTypeToTypeMeta(type)};
}

// Deterministic mode fills new memory (NaN, or an integer type's maximum) as
// CPU and CUDA do, so that a kernel reading what it never wrote gives the
// same result on every run.
at::Tensor filled_if_deterministic(at::Tensor t) {
  if (at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory()) {
    at::native::fill_empty_deterministic_(t);
  }
  return t;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  const auto args = check_new_tensor(dtype, layout, device, pin_memory);
  at::detail::check_size_nonnegative(size);
  const size_t nbytes = at::detail::computeStorageNbytesContiguous(size, args.dtype.itemsize());
  auto impl = c10::make_intrusive<MyDevTensorImpl>(new_device_storage(args.device.index(), nbytes), args.dtype);
  impl->set_sizes_contiguous(size);
  const auto format = memory_format.value_or(at::MemoryFormat::Contiguous);
  if (format != at::MemoryFormat::Contiguous) {
    impl->empty_tensor_restride(format);
  }
  return filled_if_deterministic(at::Tensor(std::move(impl)));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  const auto args = check_new_tensor(dtype, layout, device, pin_memory);
  at::detail::check_size_nonnegative(size);
  const size_t nbytes = at::detail::computeStorageNbytes(size, stride, args.dtype.itemsize());
  return filled_if_deterministic(make_tensor(new_device_storage(args.device.index(), nbytes), args.dtype, size, stride, 0));
}

// Autograd's symbolic zero (the derivative of sgn for real inputs, of
// where's unselected branch, ...): sizes and a dtype but no bytes, tagged with
// the ZeroTensor key. PyTorch's ZeroTensor kernels (add, mul, ...) treat it as
// all zeros, and its ZeroTensor fallback turns it into a real zeros tensor on
// mydev before any other kernel would read it.
at::Tensor efficientzerotensor(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory) {
  const auto args = check_new_tensor(dtype, layout, device, pin_memory);
  at::detail::check_size_nonnegative(size);
  c10::Storage no_bytes(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 0,
                                                              c10::DataPtr(nullptr, args.device), nullptr,
                                                              /*resizable=*/false));
  auto impl = c10::make_intrusive<MyDevTensorImpl>(std::move(no_bytes), args.dtype, TensorDesc{},
                                                   c10::DispatchKeySet(c10::DispatchKey::ZeroTensor));
  impl->set_sizes_contiguous(size);
  return at::Tensor(std::move(impl));
}

} // namespace

at::Tensor empty_device(c10::IntArrayRef sizes, c10::IntArrayRef strides, const c10::TensorOptions& options) {
  if (strides.empty()) {
    // No strides: TensorIterator's fast set-up asks for a dense output this
    // way, with the inputs' memory format (channels_last) in the options.
    return empty_memory_format(sizes, options.dtype().toScalarType(), options.layout(), options.device(),
                               std::nullopt, options.memory_format_opt());
  }
  return empty_strided(sizes, strides, options.dtype().toScalarType(), options.layout(), options.device(),
                       std::nullopt);
}

namespace {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("_efficientzerotensor", TORCH_FN(efficientzerotensor));
}

} // namespace

c10::Storage new_device_storage(c10::DeviceIndex device, size_t nbytes) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            allocate_on(device, nbytes), device_allocator(),
                                                            /*resizable=*/true));
}

} // namespace my_device
