// my_device._C's profiler entry points (for tests and diagnostics).
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "KernelTrace.h"

namespace my_device {
bool kineto_profiler_registered();  // ActivityProfiler.cpp

void init_profiler_bindings(py::module& m) {
  m.def("_kineto_profiler_registered", &kineto_profiler_registered,
        "Whether the mydev IActivityProfiler is registered with PyTorch's PrivateUse1 profiler registry.");
}
} // namespace my_device
