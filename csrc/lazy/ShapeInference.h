#pragma once
// Shape functions of the generated Lazy kernels (build/generated/lazy/LazyNativeFunctions.cpp) for the
// ops of mydev_lazy_ops.yaml that have no meta kernel. Torch exports most of them
// (torch/csrc/lazy/core/shape_inference.h); the ones below are ours (ShapeInference.cpp). They live in
// torch::lazy because the generated kernels call torch::lazy::compute_shape_<op>.
#include <torch/csrc/lazy/core/shape_inference.h>

#include "IrNode.h"

namespace torch::lazy {
// clang-format off (gen_lazy_kernels.py compares these lines with the ones torchgen expects)
// clang-format on
} // namespace torch::lazy
