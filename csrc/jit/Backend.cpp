// TorchScript's to_backend("mydev"): preprocess lowers each method into a
// mydev program (its text and the frozen weights: the blob saved with the
// module), compile turns the blob into programs, execute runs one as a single
// launch on the current stream.
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/backends/backend.h>
#include <torch/csrc/jit/backends/backend_debug_handler.h>
#include <torch/csrc/jit/backends/backend_exception.h>
#include <torch/csrc/jit/backends/backend_preprocess.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/custom_class.h>

#include "Lowering.h"
#include "compiler/Program.h"
#include "core/Device.h"

namespace my_device::jit {

namespace {

// What compile() makes of one method: its program and its weights on the device.
struct MethodProgram : torch::CustomClassHolder {
  std::shared_ptr<compiler::Program> program;
  std::vector<at::Tensor> weights;
  std::string method;
};

const auto register_method_program = torch::class_<MethodProgram>("my_device", "MethodProgram");

// The example inputs of a method, from its compile spec: {"inputs": [tensors]}.
std::vector<c10::IValue> example_inputs(const c10::IValue& spec, const std::string& method) {
  TORCH_CHECK(spec.isGenericDict(), "to_backend(\"mydev\"): the compile spec of '", method,
              "' must be a dict with \"inputs\" (example tensors, which fix the input geometry)");
  const auto dict = spec.toGenericDict();
  TORCH_CHECK(dict.contains("inputs"), "to_backend(\"mydev\"): the compile spec of '", method,
              "' has no \"inputs\" (example tensors)");
  const c10::IValue inputs = dict.at("inputs");
  std::vector<c10::IValue> out;
  if (inputs.isTuple()) {
    for (const auto& v : inputs.toTupleRef().elements()) out.push_back(v);
  } else {
    for (const auto& v : inputs.toListRef()) out.push_back(v);
  }
  return out;
}

c10::IValue preprocess(const torch::jit::Module& module, const c10::Dict<c10::IValue, c10::IValue>& compile_spec,
                       const torch::jit::BackendDebugHandleGenerator& generate_debug_handles) {
  torch::jit::Module copy = module.clone();
  copy.eval();
  std::vector<std::string> methods;
  for (const auto& item : compile_spec) methods.push_back(item.key().toStringRef());
  std::vector<std::string> preserved;
  for (const auto& m : methods) {
    if (m != "forward") preserved.push_back(m);
  }
  torch::jit::Module frozen = torch::jit::freeze_module(copy, preserved);
  c10::impl::GenericDict blob(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : compile_spec) {
    const std::string method = item.key().toStringRef();
    auto graph = frozen.get_method(method).graph()->copy();
    torch::jit::Inline(*graph);
    const torch::jit::NodeToDebugHandle handles = generate_debug_handles(graph);
    std::vector<c10::IValue> inputs{c10::IValue()};  // `self`, unused once frozen
    for (auto& v : example_inputs(item.value(), method)) inputs.push_back(v);
    std::unordered_map<torch::jit::Node*, int64_t> node_handles(handles.begin(), handles.end());
    LoweredGraph lowered = lower(graph, inputs, "jit_" + method, &node_handles);
    std::vector<at::Tensor> weights;
    for (const at::Tensor& w : lowered.constants) weights.push_back(w.cpu());  // saved on any machine
    blob.insert(method, c10::ivalue::Tuple::create({lowered.graph.str(), c10::List<at::Tensor>(weights)}));
  }
  return blob;
}

class MydevJitBackend : public torch::jit::PyTorchBackendInterface {
 public:
  bool is_available() override {
    return device_count() > 0;
  }

  c10::impl::GenericDict compile(c10::IValue processed, c10::impl::GenericDict method_compile_spec) override {
    auto blob = processed.toGenericDict();
    c10::impl::GenericDict handles(c10::StringType::get(), c10::AnyType::get());
    for (const auto& item : method_compile_spec) {
      const std::string method = item.key().toStringRef();
      const auto entry = blob.at(method).toTupleRef().elements();
      auto h = c10::make_intrusive<MethodProgram>();
      h->method = method;
      h->program = compiler::Program::compile(compiler::Graph::parse(entry[0].toStringRef()));
      const c10::Device device(kMyDev, current_device());
      for (const at::Tensor& w : entry[1].toTensorList()) h->weights.push_back(w.to(device));
      handles.insert(method, h);
    }
    return handles;
  }

  c10::impl::GenericList execute(c10::IValue handle, c10::impl::GenericList inputs) override {
    auto h = handle.toCustomClass<MethodProgram>();
    std::vector<at::Tensor> args;
    for (const c10::IValue& v : inputs) {
      TORCH_CHECK(v.isTensor(), "mydev-lowered ", h->method, ": inputs must be tensors");
      args.push_back(v.toTensor());
    }
    args.insert(args.end(), h->weights.begin(), h->weights.end());
    c10::impl::GenericList out(c10::TensorType::get());
    for (at::Tensor& t : h->program->run(args)) out.push_back(std::move(t));
    return out;
  }
};

const auto register_backend = torch::jit::backend<MydevJitBackend>("mydev");
const auto register_preprocess = torch::jit::backend_preprocess_register("mydev", preprocess);

} // namespace

} // namespace my_device::jit
