// my_device._C._distributed: what my_device/distributed.py needs to build an
// mccl process group. torch.distributed must be imported first: it registers
// the Python types of c10d::Backend and c10d::Store that these calls take.
#include <torch/csrc/utils/pybind.h>

#include <chrono>

#include "ProcessGroupMCCL.h"

namespace my_device::distributed {

void init_bindings(pybind11::module& parent) {
  auto m = parent.def_submodule("_distributed", "mccl, the collective backend of mydev tensors");
  // Returned as a c10d::Backend: pybind gives Python the registered base type,
  // which is what ProcessGroup._register_backend takes.
  m.def(
      "_create_mccl",
      [](const c10::intrusive_ptr<c10d::Backend>& transport, int rank, int size, double timeout_seconds)
          -> c10::intrusive_ptr<c10d::Backend> {
        const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000.0));
        return c10::make_intrusive<ProcessGroupMCCL>(transport, rank, size, timeout);
      },
      pybind11::arg("transport"), pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout_seconds"));
}

} // namespace my_device::distributed
