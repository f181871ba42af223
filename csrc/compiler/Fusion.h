#pragma once
// Elementwise fusion: which ATen ops an ElementwiseKernel can evaluate, and
// how a group of them becomes one kernel.
//
// To add a fusion rule: give the op an entry in Fusion.cpp's table (how its
// arguments become registers and which instructions compute it); if it needs
// a new instruction, add the Opcode in Elementwise.h and its loop in
// Elementwise.cpp. test/test_compiler.py's rule test checks every table entry
// against the op's eager result.
#include "Elementwise.h"
#include "Graph.h"

#include <optional>
#include <string>
#include <vector>

namespace my_device::compiler {

// Whether `node` of `g` is an elementwise op the kernel can evaluate, with
// every tensor it reads and writes Float or Bool.
bool is_fusible_pointwise(const Graph& g, const Node& node);
// The reduction `node` would attach to a group producing its input, if it is
// one the kernel can fuse (sum/mean/amax/amin over dims of a Float tensor).
std::optional<ReduceKind> fusible_reduction(const Graph& g, const Node& node);

// Builds the kernel of a group: `members` are node indices in program order,
// their last one optionally a reduction. `inputs` receives the value ids the
// kernel loads (its inputs, in order), and `stored` the values it must write
// (its outputs, in order; the reduction's result last).
ElementwiseKernel build_kernel(const Graph& g, const std::vector<int>& members, const std::vector<int>& stored,
                               std::vector<int>& inputs);

} // namespace my_device::compiler
