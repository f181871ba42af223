// Strided nested tensors (torch.nested with layout=torch.strided) on mydev: the
// ops PyTorch implements for every device (its composite and nested-generic
// kernels) work; an op whose nested kernel exists only for CPU or CUDA raises a
// NotImplementedError that names the op and the way out, instead of the
// dispatcher's "Could not run ... 'NestedTensormydev' backend".
//
// Why not run the CPU's nested kernels as host kernels, as for dense and sparse
// tensors: a strided nested tensor is a NestedTensorImpl (a buffer plus size,
// stride and offset metadata tensors) that HostCall cannot map yet. Jagged
// nested tensors (layout=torch.jagged) are Python subclasses over ordinary
// mydev tensors and need nothing here.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_nested_tensor_size_native.h>
#include <ATen/ops/_nested_tensor_storage_offsets_native.h>
#include <ATen/ops/_nested_tensor_strides_native.h>
#include <torch/library.h>

namespace my_device {
namespace {

void reject_nested(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().operator_name(),
                              " has no kernel for strided nested tensors on mydev (NestedTensorPrivateUse1): "
                              "PyTorch implements it for the CPU and CUDA only. Use a jagged nested tensor "
                              "(torch.nested.nested_tensor(..., layout=torch.jagged)), or run this op on the CPU.");
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&reject_nested>());
}

// The metadata accessors read the NestedTensorImpl's own CPU metadata, on any
// device. Autograd asks for the sizes when a nested tensor that requires grad
// is built; rejected, that error was thrown where autograd cannot pass it on,
// and ended the process.
TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_nested_tensor_size", TORCH_FN(at::native::_nested_tensor_size));
  m.impl("_nested_tensor_strides", TORCH_FN(at::native::_nested_tensor_strides));
  m.impl("_nested_tensor_storage_offsets", TORCH_FN(at::native::_nested_tensor_storage_offsets));
}

} // namespace
} // namespace my_device
