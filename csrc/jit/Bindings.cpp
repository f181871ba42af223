// my_device._C._jit: the TorchScript frontends' Python face (my_device/jit.py).
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <map>

namespace my_device::jit {

void enable_fusion(bool on);  // FusionPass.cpp
bool fusion_enabled();
std::pair<int64_t, int64_t> fusion_stats();
void reset_fusion_stats();

namespace {

// Gives a method's arguments that share a name (a traced module's inputs are named after the parameter the
// tracer first met them as, so two can both be `inp`) names of their own, in its schema and its graph.
// torch's to_backend writes the lowered module's wrapper from the schema's names, and with two alike it
// passes one input in both places (my_device/jit.py, distinct_input_names, says more).
void distinct_argument_names(const torch::jit::Module& module, const std::string& method_name) {
  torch::jit::Function& fn = module.get_method(method_name).function();
  const c10::FunctionSchema& schema = fn.getSchema();
  std::vector<c10::Argument> args = schema.arguments();
  std::map<std::string, int> uses;
  for (const c10::Argument& a : args) uses[a.name()] += 1;
  bool renamed = false;
  auto inputs = torch::jit::toGraphFunction(fn).graph()->inputs();
  for (size_t i = 1; i < args.size(); ++i) {
    const c10::Argument& a = args[i];
    if (uses[a.name()] < 2) continue;
    std::string name = a.name() + "_" + std::to_string(i);
    while (uses.count(name)) name += "_";
    uses[name] = 1;
    args[i] = c10::Argument(name, a.type(), a.N(), a.default_value(), a.kwarg_only(), a.alias_info()
                                                                                         ? std::optional<c10::AliasInfo>(*a.alias_info())
                                                                                         : std::nullopt);
    if (i < inputs.size()) inputs[i]->setDebugName(name);
    renamed = true;
  }
  if (renamed) fn.setSchema(schema.cloneWithArguments(std::move(args)));
}

} // namespace

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
  m.def("distinct_argument_names", [](const pybind11::object& module, const std::string& method) {
    distinct_argument_names(pybind11::cast<torch::jit::Module>(module.attr("_c")), method);
  }, "Gives arguments of `method` of a ScriptModule that share a name names of their own.");
}

} // namespace my_device::jit
