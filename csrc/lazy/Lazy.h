#pragma once
// The mydev Lazy Tensor backend (Backend.cpp), its eager fallback
// (EagerFallback.cpp) and the kernels it adds to the generated ones.
#include <c10/core/Device.h>
#include <torch/csrc/lazy/backend/backend_device.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace my_device::lazy {

struct LazyMetrics {
  std::atomic<int64_t> graphs_compiled{0};  // mydev programs built from traced graphs
  std::atomic<int64_t> executions{0};       // programs run
  std::atomic<int64_t> fallback_ops{0};     // ops run by the eager fallback on mydev tensors
  std::atomic<int64_t> transfer_bytes{0};   // bytes copied from the host into lazy tensors' device data
};
LazyMetrics& metrics();
// The mydev device holding a lazy device's data.
c10::Device device_of(const torch::lazy::BackendDevice& d);
// The dump of the last program built.
std::string last_graph();

// Registers the backend, the lazy kernels and the eager fallback (once).
void init();
void register_eager_fallback();
// LTC's graph executor with a hash that covers the graph's wiring (GraphExecutor.cpp).
void register_graph_executor();
// Per parameter of the graph being compiled on this thread, whether it is a number LTC uploaded as a
// 0-dim tensor (GraphExecutor.cpp).
std::vector<bool> wrapped_number_parameters_of_last_graph();
// Lazy kernels of ops whose default implementation does not trace (Decompositions.cpp).
void register_lazy_decompositions();
// Composite kernels run with functionalization on (FunctionalizedComposites.cpp).
void register_functionalized_composites();

} // namespace my_device::lazy
