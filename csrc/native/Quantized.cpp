// Quantized tensors are not supported on mydev: the ops that would create one
// raise a NotImplementedError naming the op, at the call.
//
// Why: a quantized tensor is a QTensorImpl with a Quantizer, dispatched to the
// Quantized<backend> key; every kernel behind that key is a CPU (fbgemm/qnnpack)
// or CUDA kernel written for that TensorImpl. Without these registrations the
// copying fallback would quantize on the CPU and then fail to allocate the
// result on mydev ("Could not run 'aten::empty_quantized' ... 'Quantizedmydev'
// backend"), an error that does not say what is unsupported. Fake quantization
// (torch.fake_quantize_per_tensor_affine, torch.ao's QAT modules) works on mydev:
// it computes on ordinary float tensors.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace my_device {
namespace {

void reject_quantized(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "quantized tensors are not supported on mydev: ", op.schema().operator_name(),
                              " would make or use one. Quantize on the CPU (tensor.cpu()), or use fake quantization "
                              "(torch.fake_quantize_per_tensor_affine, QAT), which runs on mydev.");
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name :
       {"quantize_per_tensor", "quantize_per_tensor.tensor_qparams", "quantize_per_tensor.tensors",
        "quantize_per_tensor_dynamic", "quantize_per_channel", "_make_per_tensor_quantized_tensor",
        "_make_per_channel_quantized_tensor", "_empty_affine_quantized", "_empty_per_channel_affine_quantized",
        "empty_quantized"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&reject_quantized>());
  }
}

// Factories given a quantized dtype and device="mydev" (_empty_affine_quantized)
// dispatch straight to the QuantizedPrivateUse1 key.
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&reject_quantized>());
}

} // namespace
} // namespace my_device
