#pragma once
// TorchScript -> the mydev graph compiler's IR (csrc/compiler/Graph.h).
//
// TorchScript graphs carry no exact geometry, and the IR needs every tensor's
// sizes and strides. So the lowering runs the graph once on Meta tensors built
// from example inputs: each op's Meta kernel gives its outputs' geometry, ops
// that compute numbers from shapes (aten::size, aten::Int...) fold into
// constants, and each tensor op becomes one IR node. This is the TorchScript
// frontend's half of lowering, shared by to_backend("mydev") (Backend.cpp) and
// the transparent fusion pass (FusionPass.cpp); everything after it is the
// one compiler every frontend shares.
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/Graph.h"

namespace my_device::jit {

struct LoweredGraph {
  compiler::Graph graph;
  // Tensor constants of the TorchScript graph (frozen weights): the program
  // takes them as inputs after the graph's own tensor inputs.
  std::vector<at::Tensor> constants;
  // Per graph input: its index among the program's inputs, or -1 for an input
  // that is not a tensor (folded in as a constant) or not used.
  std::vector<int> input_slots;
};

// Lowers `graph` (inlined, without control flow or calls) for `inputs`
// (tensors give their geometry; other values are folded in). A node the
// program cannot express raises c10::Error quoting its source range.
// `debug_handles`, if given, maps nodes to the handles recorded in the IR's
// source annotations. `numbers`, if given, marks the inputs that are 0-dim
// tensors standing for numbers (a lazy graph's Python numbers, kept on the
// device so that a new value needs no new program): each op reading one takes
// it as a tensor, and is refused where that would promote otherwise than the
// number did.
LoweredGraph lower(const std::shared_ptr<torch::jit::Graph>& graph, const std::vector<c10::IValue>& inputs,
                   const std::string& name,
                   const std::unordered_map<torch::jit::Node*, int64_t>* debug_handles = nullptr,
                   const std::vector<bool>* numbers = nullptr);

// The same check lower() applies to one node, for the fusion pass: whether a
// program can express it (an ATen op with a schema and CPU and Meta kernels).
bool lowerable(const torch::jit::Node* node);

} // namespace my_device::jit
