#pragma once
// Tensors imported through DLPack as mydev tensors (DLPack.cpp).
#include <ATen/core/Tensor.h>

namespace my_device {

// Whether the tensor's TensorImpl is MyDevTensorImpl.
bool is_mydev_tensor_impl(const at::Tensor& t);
// A mydev tensor whose TensorImpl is not mydev's (at::from_blob's, for a DLPack
// import) re-homed in a MyDevTensorImpl over the same storage; any other
// tensor as it is.
at::Tensor as_mydev_tensor(const at::Tensor& t);

} // namespace my_device
