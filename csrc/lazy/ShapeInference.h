#pragma once
// Shape functions of the generated Lazy kernels (build/generated/mydev_lazy/LazyNativeFunctions.cpp) for the
// ops of mydev_lazy_ops.yaml that have no meta kernel. Torch exports most of them
// (torch/csrc/lazy/core/shape_inference.h); the ones below are ours (ShapeInference.cpp): ops torch has no
// shape function for, or has one only for the SymInt signature, which our kernels do not take (see
// `symint` in the yaml). They live in
// torch::lazy because the generated kernels call torch::lazy::compute_shape_<op>.
#include <torch/csrc/lazy/core/shape_inference.h>

namespace torch::lazy {
// One line each, as torchgen prints them: gen_lazy_kernels.py compares the lines.
// clang-format off
TORCH_API std::vector<torch::lazy::Shape> compute_shape_copy(const at::Tensor & self, const at::Tensor & src, bool non_blocking);
TORCH_API std::vector<torch::lazy::Shape> compute_shape_as_strided_scatter(const at::Tensor & self, const at::Tensor & src, at::IntArrayRef size, at::IntArrayRef stride, ::std::optional<int64_t> storage_offset);
// clang-format on
} // namespace torch::lazy
