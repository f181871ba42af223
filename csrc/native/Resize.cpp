// Changing a tensor's storage or its size in place: resize_ and the set_ family.
// Growing a storage is a device allocation plus a runtime copy; the CPU resize
// helpers would memcpy device bytes from host code.
#include <ATen/Context.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/is_set_to_native.h>
#include <torch/library.h>

#include "core/Allocator.h"
#include "core/Exception.h"
#include "core/Launch.h"
#include "core/TensorImpl.h"

namespace my_device {

void resize_storage_bytes(c10::StorageImpl* storage, size_t new_bytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  const c10::DeviceIndex device = storage->device().index();
  c10::DataPtr data = allocate_on(device, new_bytes);
  const size_t keep = std::min(new_bytes, storage->nbytes());
  if (keep == 0 && storage->nbytes() > 0) {
    // Freeing (untyped_storage().resize_(0), as FSDP2 does with unsharded parameters right after
    // queuing the kernels that use them): a queued kernel that holds this storage by reference
    // reaches its bytes when it runs (KernelArgs), so they go only after the current stream's
    // queued work ran. (The copy below waits for the device's work itself.)
    launch_inline(device, [] {});
  }
  if (keep > 0) {
    MYDEV_CHECK(mydevMemcpy(data.get(), storage->data(), keep, mydevMemcpyDeviceToDevice));
  }
  storage->set_data_ptr_noswap(std::move(data));
  storage->set_nbytes(new_bytes);
}

namespace {

void ensure_storage_fits(const at::Tensor& self) {
  if (self.numel() == 0) return;
  const size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(),
                                                         self.storage_offset());
  const size_t old = self.storage().nbytes();
  if (needed > old) {
    resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
    // Deterministic mode fills the new bytes, as CPU and CUDA do.
    if (at::globalContext().deterministicAlgorithms() &&
        at::globalContext().deterministicFillUninitializedMemory()) {
      at::native::fill_resize_deterministic_(self, static_cast<int64_t>(old));
    }
  }
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  at::detail::check_size_nonnegative(size);
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size) {
    impl->set_sizes_contiguous(size);
  }
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve, "Unsupported memory format", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  ensure_storage_fits(self);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(source.device() == self.device() || !source.device().has_index(),
              "Attempted to set the storage of a tensor on device \"", self.device(),
              "\" to a storage on different device \"", source.device(),
              "\".  This is no longer allowed; the devices must match.");
  TORCH_CHECK(storage_offset >= 0, "Tensor: invalid storage offset ", storage_offset);
  auto* impl = self.unsafeGetTensorImpl();
  if (!self.storage().is_alias_of(source)) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(storage_offset);
  } else {
    TORCH_CHECK(size.size() == stride.size(), "dimensionality of sizes (", size.size(),
                ") must match dimensionality of strides (", stride.size(), ")");
    impl->set_sizes_and_strides(size, stride, storage_offset);
  }
  ensure_storage_fits(self);
  return self;
}

at::Tensor& set_source_storage_offset(at::Tensor& self, c10::Storage source, c10::SymInt storage_offset,
                                      c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return set_storage(self, std::move(source), storage_offset.expect_int(), C10_AS_INTARRAYREF_SLOW(size),
                     C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), 0, allocate_on(self.device().index(), 0), device_allocator(),
      /*resizable=*/true));
  return set_storage(self, std::move(empty), 0, {0}, {});
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_source_storage_offset));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("is_set_to", TORCH_FN(at::native::is_set_to));
}

} // namespace
} // namespace my_device
