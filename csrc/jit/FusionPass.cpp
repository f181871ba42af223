// Transparent JIT mode: a TorchScript pass that moves maximal runs of ops a
// mydev program can express into mydev::CompilationGroup nodes, and the
// operator that runs such a group: lowered and compiled the first time it
// sees an input geometry (cached), then run as one launch. Unsupported ops
// stay in TorchScript and run as eager mydev kernels.
//
// Graphs that record autograd are left alone: a group has no backward, so
// the pass only fuses where the profiled inputs do not require grad.
#include <torch/csrc/jit/passes/graph_fuser.h>
#include <torch/csrc/jit/passes/pass_manager.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/register_ops_utils.h>

#include <ATen/ops/empty_strided.h>
#include <torch/csrc/jit/ir/constants.h>

#include <atomic>
#include <map>
#include <mutex>

#include "Lowering.h"
#include "compiler/Program.h"
#include "core/Device.h"

namespace my_device::jit {

namespace {

const c10::Symbol kGroup = c10::Symbol::fromQualString("mydev::CompilationGroup");

std::atomic<int64_t> g_groups_compiled{0};
std::atomic<int64_t> g_groups_run{0};
std::mutex g_pass_mutex;
std::optional<torch::jit::GraphPassNameType> g_pass;

// A node joins a group if a program can express it and every tensor it
// touches was profiled on mydev without requiring grad.
// Whether the op's Meta kernel accepts the node's profiled inputs: ops whose
// output shapes depend on the data (nonzero, boolean indexing) refuse, and so
// stay in TorchScript, as do nodes whose inputs were not fully profiled.
bool meta_runs(const torch::jit::Node* node) {
  const c10::FunctionSchema& schema = node->schema();
  auto op = c10::Dispatcher::singleton().findSchema({schema.name(), schema.overload_name()});
  if (!op) return false;
  torch::jit::Stack stack;
  for (const torch::jit::Value* v : node->inputs()) {
    if (auto t = v->type()->cast<c10::TensorType>()) {
      const auto sizes = t->sizes().concrete_sizes();
      const auto strides = t->strides().concrete_sizes();
      if (!sizes || !strides || !t->scalarType()) return false;
      stack.emplace_back(at::empty_strided(*sizes, *strides, at::TensorOptions().dtype(*t->scalarType()).device(c10::kMeta)));
    } else if (auto c = torch::jit::toIValue(v)) {
      stack.push_back(c->isDevice() ? c10::IValue(c10::Device(c10::kMeta)) : *c);
    } else {
      return false;  // a number known only at run time
    }
  }
  try {
    op->callBoxed(stack);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Views stay outside groups: a group's outputs are fresh tensors (the group is
// registered as a pure function), never aliases of its inputs.
bool fusible(torch::jit::Node* node) {
  if (!lowerable(node)) return false;
  for (const c10::Argument& r : node->schema().returns()) {
    if (r.alias_info()) return false;
  }
  bool any_tensor = false;
  auto ok = [&](const torch::jit::Value* v) {
    auto t = v->type()->cast<c10::TensorType>();
    if (!t) return true;
    any_tensor = true;
    const auto device = t->device();
    return device && device->type() == kMyDev && t->requiresGrad() == false;
  };
  for (const auto* v : node->inputs()) {
    if (!ok(v)) return false;
  }
  for (const auto* v : node->outputs()) {
    if (!ok(v)) return false;
  }
  return any_tensor && meta_runs(node);
}

void fuse(std::shared_ptr<torch::jit::Graph>& graph) {
  torch::jit::CustomFuseGraph(graph, fusible, kGroup);
}

// One group node's programs, by input geometry.
struct GroupCache {
  std::mutex mutex;
  std::map<std::vector<int64_t>, std::pair<std::shared_ptr<compiler::Program>, LoweredGraph>> programs;
};

std::vector<int64_t> geometry_key(const torch::jit::Stack& inputs) {
  std::vector<int64_t> key;
  for (const c10::IValue& v : inputs) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      key.push_back(static_cast<int64_t>(t.scalar_type()));
      key.push_back(t.dim());
      for (int64_t s : t.sizes()) key.push_back(s);
      for (int64_t s : t.strides()) key.push_back(s);
      key.push_back(t.device().index());
    } else if (v.isInt()) {
      key.push_back(-1);
      key.push_back(v.toInt());
    } else {
      key.push_back(-2);  // other constants fold in: the first value seen is the one compiled
    }
  }
  return key;
}

torch::jit::Operation run_group(const torch::jit::Node* node) {
  auto subgraph = node->g(c10::attr::Subgraph);
  const size_t n_in = node->inputs().size();
  const size_t n_out = node->outputs().size();
  auto cache = std::make_shared<GroupCache>();
  return [subgraph, n_in, n_out, cache](torch::jit::Stack& stack) {
    const auto inputs = torch::jit::last(stack, n_in).vec();
    const auto key = geometry_key(inputs);
    std::shared_ptr<compiler::Program> program;
    std::vector<int> slots;
    std::vector<at::Tensor> constants;
    {
      std::lock_guard<std::mutex> lock(cache->mutex);
      auto it = cache->programs.find(key);
      if (it == cache->programs.end()) {
        LoweredGraph lowered = lower(subgraph, inputs, "jit_group_" + std::to_string(g_groups_compiled.load()));
        for (at::Tensor& c : lowered.constants) {
          c = c.to(c10::Device(kMyDev, inputs.empty() ? current_device() : current_device()));
        }
        auto p = compiler::Program::compile(lowered.graph);
        g_groups_compiled += 1;
        it = cache->programs.emplace(key, std::make_pair(p, std::move(lowered))).first;
      }
      program = it->second.first;
      slots = it->second.second.input_slots;
      constants = it->second.second.constants;
    }
    std::vector<at::Tensor> args;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (slots[i] >= 0) args.push_back(inputs[i].toTensor());
    }
    args.insert(args.end(), constants.begin(), constants.end());
    std::vector<at::Tensor> outs = program->run(args);
    g_groups_run += 1;
    torch::jit::drop(stack, n_in);
    TORCH_CHECK(outs.size() == n_out, "mydev::CompilationGroup: the program returned ", outs.size(),
                " tensors for ", n_out, " outputs");
    for (at::Tensor& t : outs) stack.emplace_back(std::move(t));
  };
}

const torch::jit::RegisterOperators register_group({torch::jit::Operator(
    kGroup, run_group, c10::AliasAnalysisKind::PURE_FUNCTION)});

} // namespace

void enable_fusion(bool on) {
  std::lock_guard<std::mutex> lock(g_pass_mutex);
  if (on && !g_pass) g_pass = torch::jit::registerPostPass(fuse);
  if (!on && g_pass) {
    torch::jit::clearPostPass(*g_pass);
    g_pass.reset();
  }
}

bool fusion_enabled() {
  std::lock_guard<std::mutex> lock(g_pass_mutex);
  return g_pass.has_value();
}

std::pair<int64_t, int64_t> fusion_stats() {
  return {g_groups_compiled.load(), g_groups_run.load()};
}

void reset_fusion_stats() {
  g_groups_compiled = 0;
  g_groups_run = 0;
}

} // namespace my_device::jit
