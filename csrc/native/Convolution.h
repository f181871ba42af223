#pragma once
// Convolution's cut into blocks of samples, shared with compiled programs.
#include <ATen/core/Tensor.h>

#include <optional>

namespace my_device {

// How many blocks of samples a convolution of host tensors is worth cutting
// into for the compute units (block_count): 1 for an unbatched input, and 1
// where a block would take another of the CPU's convolution algorithms than
// the whole batch (oneDNN's choice depends on the batch size and the tensor's
// size), whose bits would differ.
int convolution_sample_parts(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                             bool transposed, c10::IntArrayRef output_padding, int64_t groups, int64_t out_numel);

} // namespace my_device
