// torch.mydev's graph and memory-pool functions (my_device/mydev/graphs.py,
// memory.py). The graph class itself is torch.accelerator.Graph's, which
// reaches core/Graph.cpp through PyTorch's registry.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "../core/Allocator.h"
#include "../core/Device.h"
#include "../core/Graph.h"

namespace my_device {

void init_graph_bindings(pybind11::module& m) {
  m.def("_register_graph_impl", &register_graph_impl);
  m.def("_is_current_stream_capturing",
        [](int device) { return current_stream_capturing(static_cast<c10::DeviceIndex>(device)); });
  m.def("_graph_pool_handle", [] { return new_pool_id(/*user_created=*/true); });
  m.def("_mempool_create", [](int device) {
    const c10::MempoolId_t id = new_pool_id(/*user_created=*/true);
    retain_pool(static_cast<c10::DeviceIndex>(device), id);
    return id;
  });
  m.def("_mempool_release", [](int device, c10::MempoolId_t id) {
    release_pool(static_cast<c10::DeviceIndex>(device), id);
  });
  m.def("_mempool_use_count", [](int device, c10::MempoolId_t id) {
    return pool_use_count(static_cast<c10::DeviceIndex>(device), id);
  });
  m.def("_begin_allocate_current_thread_to_pool", [](int device, c10::MempoolId_t id) {
    begin_allocate_to_pool(static_cast<c10::DeviceIndex>(device), id, /*capture_id=*/0);
  });
  m.def("_end_allocate_current_thread_to_pool", [](int device, c10::MempoolId_t id) {
    end_allocate_to_pool(static_cast<c10::DeviceIndex>(device), id);
  });
}

} // namespace my_device
