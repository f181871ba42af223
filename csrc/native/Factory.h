#pragma once
#include <ATen/core/Tensor.h>

namespace my_device {

// A new mydev tensor with the given geometry, bypassing the dispatcher (for
// kernels that allocate their own outputs). Empty `strides` means contiguous.
at::Tensor empty_device(c10::IntArrayRef sizes, c10::IntArrayRef strides, const c10::TensorOptions& options);
// A resizable storage of `nbytes` on `device`.
c10::Storage new_device_storage(c10::DeviceIndex device, size_t nbytes);

} // namespace my_device
