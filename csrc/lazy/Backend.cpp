// The Lazy Tensor backend of mydev: traced graphs run as mydev programs.
//
// Tracing and the IR are PyTorch's own: the TorchScript lazy kernels
// (torchgen-generated in libtorch, with functionalization) record IR nodes,
// and TSLoweringContext turns a traced graph into a TorchScript graph. The
// backend's part is everything that touches the device:
//  - BackendData holds a mydev tensor (device memory, counted by
//    torch.mydev.memory_allocated), always contiguous, so compiled programs
//    see the geometry they were compiled for. It is a TSData, the only kind
//    TSLoweringContext accepts (it casts without checking), with its tensor
//    on mydev;
//  - Compile lowers each TorchScript graph with the TorchScript frontend
//    (csrc/jit/Lowering.h) into a mydev program;
//  - ExecuteComputation runs it as one launch on the current stream.
// TSBackendImpl cannot be subclassed (its class is not exported), so this
// backend delegates what it does not change (the IR builder, lowering
// contexts) to GetTSBackendImpl().
#include <torch/csrc/lazy/backend/backend_data.h>
#include <torch/csrc/lazy/backend/backend_interface.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>
#include <torch/csrc/lazy/ts_backend/ts_lowering_context.h>
#include <ATen/ops/scalar_tensor.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "Lazy.h"
#include "compiler/Program.h"
#include "core/Device.h"
#include "jit/Lowering.h"

namespace at {
// libtorch's TorchScript lazy kernels and their autograd kernels (exported, not declared in a header).
TORCH_API void RegisterTorchScriptLazyNativeFunctions();
TORCH_API void RegisterTorchScriptAutogradLazyNativeFunctions();
} // namespace at

namespace my_device::lazy {

namespace {

LazyMetrics g_metrics;

// Device data that may also know its value on the host: a number LTC turned
// into a 0-dim tensor (x + 1). TS lowering reads such parameters back as
// numbers (aten::ScalarImplicit), which a program folds into a constant, so
// the value has to be known without reading device memory.
struct MydevData : torch::lazy::TSData {
  using TSData::TSData;
  std::optional<at::Scalar> host_value;
};

// Inputs of `graph` that some op reads as a number.
std::vector<bool> read_as_numbers(const torch::jit::Graph& graph) {
  std::vector<bool> out;
  for (const torch::jit::Value* in : graph.inputs()) {
    bool numeric = false;
    for (const torch::jit::Use& use : in->uses()) numeric = numeric || use.user->kind() == c10::aten::ScalarImplicit;
    out.push_back(numeric);
  }
  return out;
}

struct MydevDeviceType : torch::lazy::BackendDeviceType {
  MydevDeviceType() {
    type = static_cast<int8_t>(c10::DeviceType::PrivateUse1);
  }
  std::string toString() const override {
    return "mydev";
  }
};

void remember_last(std::string dump);

struct MydevComputation : torch::lazy::Computation {
  struct Lowered {
    std::shared_ptr<compiler::Program> program;
    std::vector<at::Tensor> constants;
    std::vector<int> input_slots;
  };
  std::shared_ptr<torch::jit::Graph> graph;
  std::vector<bool> numeric;  // per parameter: read as a number (see MydevData)
  std::map<std::vector<int64_t>, Lowered> programs;  // by the values of the graph's number parameters
  std::vector<std::string> names;
  std::vector<torch::lazy::Shape> shapes;
  torch::lazy::Shape result;

  int parameters_size() const override {
    return static_cast<int>(names.size());
  }
  const std::vector<torch::lazy::Shape>& parameter_shapes() const override {
    return shapes;
  }
  const std::vector<std::string>& parameter_names() const override {
    return names;
  }
  const torch::lazy::Shape& result_shape() const override {
    return result;
  }
  const std::string to_string() const override {
    return programs.empty() ? graph->toString() : programs.begin()->second.program->dump();
  }

  // The program for these arguments, lowered at the first execution with
  // these number values.
  const Lowered& program_for(const std::vector<c10::IValue>& args, const std::vector<int64_t>& numbers) {
    auto it = programs.find(numbers);
    if (it != programs.end()) return it->second;
    jit::LoweredGraph lowered =
        jit::lower(graph, args, "lazy_graph_" + std::to_string(g_metrics.graphs_compiled.load()));
    c10::Device device(kMyDev, current_device());
    for (const auto& a : args) {
      if (a.isTensor()) device = a.toTensor().device();
    }
    for (at::Tensor& k : lowered.constants) k = k.to(device);
    Lowered l{compiler::Program::compile(lowered.graph), std::move(lowered.constants), std::move(lowered.input_slots)};
    if (shapes.empty()) {
      for (const auto& a : args) {
        if (a.isTensor()) shapes.emplace_back(a.toTensor().scalar_type(), a.toTensor().sizes().vec());
      }
    }
    g_metrics.graphs_compiled += 1;
    remember_last(l.program->dump());
    return programs.emplace(numbers, std::move(l)).first->second;
  }
};

c10::Device device_of(const torch::lazy::BackendDevice& d) {
  return c10::Device(kMyDev, static_cast<c10::DeviceIndex>(d.ordinal()));
}

// What a lazy tensor's data is on the device: contiguous, on the backend device.
at::Tensor on_device(const at::Tensor& t, const torch::lazy::BackendDevice& device) {
  at::Tensor out = t.to(device_of(device)).contiguous();
  if (t.device().type() != kMyDev) g_metrics.transfer_bytes += static_cast<int64_t>(t.nbytes());
  return out;
}

class MydevBackend : public torch::lazy::BackendImplInterface {
 public:
  const torch::lazy::BackendImplInterface& ts() const {
    return *torch::lazy::GetTSBackendImpl();
  }

  void PrepareToExit() const override {}
  void SetRngSeed(size_t seed) const override {
    ts().SetRngSeed(seed);
  }
  const torch::lazy::IrBuilder* GetIrBuilder() const override {
    return ts().GetIrBuilder();
  }

  torch::lazy::BackendDataPtr MakeComputationDataFromTensor(const at::Tensor& tensor, const torch::lazy::Shape& shape,
                                                            const torch::lazy::BackendDevice& device) const override {
    auto data = std::make_shared<MydevData>(on_device(tensor, device), shape, device);
    if (tensor.dim() == 0 && tensor.device().is_cpu()) data->host_value = tensor.item();
    return data;
  }
  torch::lazy::BackendDataPtr MakeComputationDataFromScalar(const at::Scalar& scalar,
                                                            const torch::lazy::BackendDevice& device) const override {
    // A number parameter of the graph (TSLoweringContext types it int or float).
    return std::make_shared<torch::lazy::TSData>(scalar, device);
  }
  torch::lazy::BackendDataPtr CreateDataPlaceholder(const torch::lazy::BackendDevice& device,
                                                    const torch::lazy::Shape& shape) const override {
    return std::make_shared<torch::lazy::TSData>(shape, device);
  }
  torch::lazy::BackendDataPtr GetComputationDataFromNode(const torch::lazy::Node* node) const override {
    return ts().GetComputationDataFromNode(node);
  }
  at::Tensor MakeTensorFromComputationData(const torch::lazy::BackendDataPtr data,
                                           std::optional<at::ScalarType> logical_scalar_type) const override {
    auto ts = std::static_pointer_cast<torch::lazy::TSData>(data);
    at::Tensor t = ts->HasValue() ? ts->data()
                                  : at::scalar_tensor(*ts->scalar).to(device_of(data->device()));
    if (logical_scalar_type && *logical_scalar_type != t.scalar_type()) return t.to(*logical_scalar_type);
    return t;
  }

  std::unique_ptr<torch::lazy::LoweringContext> CreateLoweringContext(
      const std::string& name, torch::lazy::BackendDevice device, c10::ArrayRef<const torch::lazy::Node*> post_order,
      torch::lazy::Util::EmissionMap emit_status) const override {
    return ts().CreateLoweringContext(name, std::move(device), post_order, std::move(emit_status));
  }
  std::unique_ptr<torch::lazy::LoweringContext> CreateLoweringContext(
      const std::string& name, torch::lazy::BackendDevice device) const override {
    return ts().CreateLoweringContext(name, std::move(device));
  }
  std::vector<std::string> GetCompilationDevices(const std::string& device,
                                                 c10::ArrayRef<std::string> devices) const override {
    return std::vector<std::string>(devices.begin(), devices.end());
  }

  // The traced graphs arrive as TorchScript graphs (TSComputation). LTC does
  // not tell Compile the geometry of a graph's parameters, so each becomes a
  // mydev program at its first execution, from its arguments (contiguous
  // device tensors, so the geometry is the shape LTC hashed the graph with).
  std::vector<torch::lazy::ComputationPtr> Compile(std::vector<torch::lazy::ComputationPtr> instances) const override {
    std::vector<torch::lazy::ComputationPtr> out;
    for (const auto& instance : instances) {
      auto ts_computation = std::dynamic_pointer_cast<torch::lazy::TSComputation>(instance);
      TORCH_CHECK(ts_computation, "mydev lazy backend: expected a TorchScript computation");
      auto c = std::make_shared<MydevComputation>();
      c->graph = ts_computation->graph();
      c->numeric = read_as_numbers(*c->graph);
      c->names = ts_computation->parameter_names();
      c->in_mark_step = instance->in_mark_step;
      out.push_back(std::move(c));
    }
    return out;
  }

  std::vector<torch::lazy::BackendDataPtr> ExecuteComputation(torch::lazy::ComputationPtr computation,
                                                              c10::ArrayRef<torch::lazy::BackendDataPtr> arguments,
                                                              const torch::lazy::BackendDevice& device) const override {
    auto c = std::static_pointer_cast<MydevComputation>(computation);
    std::vector<c10::IValue> args;
    std::vector<int64_t> numbers_key;  // numbers are folded into the program: one program per set of values
    for (const auto& a : arguments) {
      auto ts = std::static_pointer_cast<torch::lazy::TSData>(a);
      auto mine = std::dynamic_pointer_cast<MydevData>(a);
      if (!ts->scalar && c->numeric[args.size()] && ts->HasValue()) {
        // A 0-dim tensor some op reads as a number: the number, from the host if known.
        const at::Scalar n = mine && mine->host_value ? *mine->host_value : ts->data().item();
        args.emplace_back(n.isFloatingPoint() ? c10::IValue(n.toDouble())
                          : n.isBoolean()     ? c10::IValue(n.toBool())
                                              : c10::IValue(n.toLong()));
        const double d = n.isFloatingPoint() ? n.toDouble() : static_cast<double>(n.toLong());
        int64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        numbers_key.push_back(bits);
      } else if (ts->scalar) {
        const at::Scalar& n = *ts->scalar;
        args.emplace_back(n.isFloatingPoint() ? c10::IValue(n.toDouble()) : c10::IValue(n.toLong()));
        const double d = n.isFloatingPoint() ? n.toDouble() : static_cast<double>(n.toLong());
        int64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        numbers_key.push_back(bits);
      } else {
        TORCH_CHECK(ts->HasValue(), "mydev lazy backend: an argument of the graph has no data");
        args.emplace_back(ts->data());
      }
    }
    const MydevComputation::Lowered& l = c->program_for(args, numbers_key);
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < args.size(); ++i) {
      if (l.input_slots[i] >= 0 && args[i].isTensor()) inputs.push_back(args[i].toTensor());
    }
    inputs.insert(inputs.end(), l.constants.begin(), l.constants.end());
    std::vector<at::Tensor> outs = l.program->run(inputs);
    g_metrics.executions += 1;
    std::vector<torch::lazy::BackendDataPtr> results;
    for (at::Tensor& t : outs) {
      at::Tensor data = t.is_contiguous() ? t : t.contiguous();
      const torch::lazy::Shape shape(data.scalar_type(), data.sizes().vec());
      results.push_back(std::make_shared<torch::lazy::TSData>(std::move(data), shape, device));
    }
    return results;
  }

  std::shared_ptr<torch::lazy::BackendDeviceType> GetDefaultDeviceType() const override {
    return std::make_shared<MydevDeviceType>();
  }
  void SetDefaultDeviceType(int8_t type) override {
    TORCH_CHECK(type == static_cast<int8_t>(c10::DeviceType::PrivateUse1), "the mydev lazy backend runs on mydev");
  }
  int64_t GetDefaultDeviceOrdinal() const override {
    return ordinal_;
  }
  void SetDefaultDeviceOrdinal(int64_t ordinal) override {
    ordinal_ = ordinal;
  }
  at::DeviceType EagerFallbackDeviceType() const override {
    return c10::DeviceType::PrivateUse1;
  }
  std::vector<torch::lazy::BackendDevice> GetBackendDevices() const override {
    std::vector<torch::lazy::BackendDevice> out;
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) out.emplace_back(GetDefaultDeviceType(), i);
    return out;
  }
  torch::lazy::BackendDevice GetBackendDevice(c10::Device device) const override {
    return torch::lazy::BackendDevice(GetDefaultDeviceType(), device.has_index() ? device.index() : 0);
  }
  std::string GetComputationBackendText(const torch::lazy::ComputationPtr computation) const override {
    return computation->to_string();
  }

 private:
  int64_t ordinal_ = 0;
};

std::mutex g_last_mutex;
std::string g_last;

void remember_last(std::string dump) {
  std::lock_guard<std::mutex> lock(g_last_mutex);
  g_last = std::move(dump);
}

} // namespace

LazyMetrics& metrics() {
  return g_metrics;
}

std::string last_graph() {
  std::lock_guard<std::mutex> lock(g_last_mutex);
  return g_last;
}

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    static MydevBackend backend;
    static torch::lazy::BackendRegistrar registrar(&backend);
    static torch::lazy::LazyGraphExecutor executor;
    torch::lazy::LazyGraphExecutor::Register(&executor);
    at::RegisterTorchScriptLazyNativeFunctions();
    at::RegisterTorchScriptAutogradLazyNativeFunctions();
    register_eager_fallback();
    register_lazy_decompositions();
  });
}

} // namespace my_device::lazy
