// my_device._C._lazy: the Lazy Tensor backend's Python face (my_device/lazy.py).
#include <torch/csrc/lazy/core/shape_inference.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "Lazy.h"

namespace my_device::lazy {

void init_bindings(pybind11::module& parent) {
  auto m = parent.def_submodule("_lazy", "The mydev Lazy Tensor backend (csrc/lazy).");
  m.def("init", &init, "Registers the mydev Lazy Tensor backend (once per process).");
  m.def("functionalize_composites", &register_functionalized_composites,
        "Gives the composite ops registered since the last call (a torch.library.custom_op defined later) "
        "their functionalizing Lazy kernel.");
  m.def("metrics", [] {
    const LazyMetrics& c = metrics();
    pybind11::dict d;
    d["graphs_compiled"] = c.graphs_compiled.load();
    d["executions"] = c.executions.load();
    d["fallback_ops"] = c.fallback_ops.load();
    d["transfer_bytes"] = c.transfer_bytes.load();
    return d;
  });
  m.def("last_graph", &last_graph);
  m.def("device_data", [](const at::Tensor& t) {
    auto ltc = torch::lazy::TryGetLtcTensor(t);
    TORCH_CHECK(ltc, "device_data: not a lazy tensor");
    auto data = std::dynamic_pointer_cast<torch::lazy::TSData>(ltc->CurrentDataHandle());
    return data && data->HasValue() ? data->data() : at::Tensor();
  }, "The device tensor holding a lazy tensor's materialised value (None before mark_step).");
  // For the test that notices when mydev's own masked_fill kernel is no longer needed.
  m.def("torch_masked_fill_shape", [](const at::Tensor& self, const at::Tensor& mask) {
    return torch::lazy::compute_shape_masked_fill(self, mask, at::Scalar(0)).at(0).sizes().vec();
  }, "torch's shape function of masked_fill.Scalar for these arguments.");
}

} // namespace my_device::lazy
