// my_device._C._compiler: the graph compiler's Python face. Frontends hand it
// a program's text (Graph.h) and get back a handle that runs it.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "Program.h"

namespace my_device::compiler {

void init_bindings(pybind11::module& parent) {
  namespace py = pybind11;
  auto m = parent.def_submodule("_compiler", "The mydev graph compiler (csrc/compiler).");
  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def_property_readonly("name", &Program::name)
      .def("run",
           [](Program& p, const std::vector<at::Tensor>& inputs, int device) {
             return p.run(inputs, static_cast<c10::DeviceIndex>(device));
           },
           py::arg("inputs"), py::arg("device") = -1,
           "Queues the program on the current stream and returns its outputs.")
      .def("dump", &Program::dump)
      .def_property_readonly("runs_side_by_side", &Program::runs_side_by_side,
                             "Whether runs share independent steps among the device's compute units (None until "
                             "the first runs, timed both ways, decide).")
      .def("set_profiling", &Program::set_profiling,
           "Times each step of later runs; dump() then shows the mean time per step.")
      .def("stats", [](const Program& p) {
        const ProgramStats& s = p.stats();
        py::dict d;
        d["nodes"] = s.nodes;
        d["steps"] = s.steps;
        d["fused_groups"] = s.fused_groups;
        d["fused_nodes"] = s.fused_nodes;
        d["views"] = s.views;
        d["calls"] = s.calls;
        d["out_calls"] = s.out_calls;
        d["gemms"] = s.gemms;
        d["peak_bytes"] = s.arena_bytes;
        d["unplanned_bytes"] = s.naive_bytes;
        return d;
      });
  m.def("compile", [](const std::string& text) { return Program::compile(Graph::parse(text)); },
        "Compiles a program from its text form.");
  m.def("parse", [](const std::string& text) { return Graph::parse(text).str(); },
        "Parses a program and prints it back (normalised).");
  m.def("counters", [] {
    const CompilerCounters& c = counters();
    py::dict d;
    d["graphs_compiled"] = c.graphs_compiled;
    d["fused_groups"] = c.fused_groups;
    d["fused_nodes"] = c.fused_nodes;
    d["launches"] = c.launches;
    d["ops_launched"] = c.ops_launched;
    return d;
  });
  m.def("reset_counters", [] { counters() = CompilerCounters{}; });
  m.def("vector_math_enabled", &vector_math_enabled,
        "Whether fused kernels compute transcendental functions with SLEEF's AVX2 functions (else libm).");
}

} // namespace my_device::compiler
