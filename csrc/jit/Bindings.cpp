// my_device._C._jit: the TorchScript frontends' Python face (my_device/jit.py).
#include <torch/extension.h>

namespace my_device::jit {

void enable_fusion(bool on);  // FusionPass.cpp
bool fusion_enabled();
std::pair<int64_t, int64_t> fusion_stats();
void reset_fusion_stats();

void init_bindings(pybind11::module& parent) {
  auto m = parent.def_submodule("_jit", "TorchScript frontends of the mydev graph compiler (csrc/jit).");
  m.def("enable_fusion", &enable_fusion, "Registers (True) or removes (False) the CompilationGroup pass.");
  m.def("fusion_enabled", &fusion_enabled);
  m.def("fusion_stats", [] {
    auto [compiled, run] = fusion_stats();
    pybind11::dict d;
    d["groups_compiled"] = compiled;
    d["groups_run"] = run;
    return d;
  });
  m.def("reset_fusion_stats", &reset_fusion_stats);
}

} // namespace my_device::jit
