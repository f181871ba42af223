#pragma once
// The base of the IR nodes torchgen generates for mydev (build/generated/lazy/LazyIr.h): TorchScript
// nodes, so TSLoweringContext lowers a traced graph and csrc/jit/Lowering.h turns it into a program.
#include <torch/csrc/lazy/ts_backend/ts_node.h>
#include <torch/csrc/lazy/ts_backend/ts_node_lowering.h>

namespace my_device::lazy {
// torchgen writes the generated nodes and kernels in our namespace (cpp_namespace of
// mydev_lazy_ops.yaml) but names torch::lazy's helpers (Value, OpKind, MHash, ...) unqualified.
using namespace torch::lazy;
} // namespace my_device::lazy
