// The Lazy graph executor of mydev: LTC's own, with a graph hash that tells
// apart graphs whose nodes are wired differently, and which notes the
// parameters that are numbers.
//
// LTC looks a traced graph's compiled program up by a hash of its roots, each
// node hashed from its op, attributes and its operands' hashes. Two device
// data of the same shape hash alike, and so do equal ops on them, so graphs
// that differ only in which of such nodes feeds which operand hash alike: the
// copies of F.batch_norm's inputs made in the order input, running mean,
// running var, weight, bias and those of torch.native_batch_norm's made in
// the order input, weight, bias, running mean, running var give one hash, and
// the second graph ran the first one's program, its running statistics read
// as weight and bias. The hash is combined here with the graph's wiring: for
// each node in post order, the positions of the nodes its operands come from.
#include <torch/csrc/lazy/backend/backend_interface.h>
#include <torch/csrc/lazy/core/hash.h>
#include <torch/csrc/lazy/core/ir.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "Lazy.h"

namespace my_device::lazy {

namespace {

torch::lazy::hash_t wiring_hash(const std::vector<const torch::lazy::Node*>& post_order,
                                const std::vector<torch::lazy::Value>& roots) {
  std::unordered_map<const torch::lazy::Node*, int64_t> position;
  position.reserve(post_order.size());
  auto at = [&](const torch::lazy::Node* n) {
    auto it = position.find(n);
    return it == position.end() ? int64_t{-1} : it->second;
  };
  torch::lazy::hash_t h = torch::lazy::MHash(static_cast<int64_t>(post_order.size()));
  for (const torch::lazy::Node* n : post_order) {
    for (const torch::lazy::Output& operand : n->operands()) {
      h = torch::lazy::HashCombine(h, torch::lazy::MHash(at(operand.node), static_cast<int64_t>(operand.index)));
    }
    position.emplace(n, static_cast<int64_t>(position.size()));
  }
  for (const torch::lazy::Value& root : roots) {
    h = torch::lazy::HashCombine(h, torch::lazy::MHash(at(root.node.get()), static_cast<int64_t>(root.index)));
  }
  return h;
}

// Per parameter of the graph (in LTC's order: its distinct device data, in post
// order), whether it is a number LTC uploaded as a 0-dim tensor: the 0.9 of
// grad * 0.9. LTC's shapes treat it as the wrapped number it was (a 0-dim
// float32 times it is float32), but its device data is a plain 0-dim float64
// tensor by then (LTC's data cache copies the number and the copy is not
// wrapped), and a program inferring dtypes from it would compute in float64.
// Seen from the graph: a 0-dim float64 parameter that an arithmetic node (the
// binary ops whose type promotion sets wrapped numbers apart) with an output
// of another dtype reads, and no other node. (A 0-dim int64 is as often a
// class target, and a copy's source must stay a tensor.)
std::vector<bool> wrapped_number_parameters(const std::vector<const torch::lazy::Node*>& post_order,
                                            const std::vector<torch::lazy::BackendDataPtr>& parameters) {
  // Every sync runs this: most graphs have no 0-dim float64 parameter, and need no more than this scan.
  const bool any = std::any_of(parameters.begin(), parameters.end(), [](const torch::lazy::BackendDataPtr& d) {
    return d->shape().dim() == 0 && d->shape().scalar_type() == at::kDouble;
  });
  if (!any) return std::vector<bool>(parameters.size(), false);
  // LTC numbers the graph's parameters by their data's handle, in post order (RunPostOrder).
  const torch::lazy::BackendImplInterface* backend = torch::lazy::getBackend();
  std::unordered_map<torch::lazy::BackendData::Handle, size_t> index_of_handle;
  for (size_t i = 0; i < parameters.size(); ++i) index_of_handle.emplace(parameters[i]->GetHandle(), i);
  std::unordered_map<const torch::lazy::Node*, size_t> parameter_of_node;
  for (const torch::lazy::Node* n : post_order) {
    torch::lazy::BackendDataPtr data = backend->GetComputationDataFromNode(n);
    if (!data) continue;
    auto it = index_of_handle.find(data->GetHandle());
    if (it != index_of_handle.end()) parameter_of_node.emplace(n, it->second);
  }
  static const std::unordered_set<std::string> arithmetic = {
      "aten::add", "aten::sub", "aten::mul", "aten::div", "aten::rsub", "aten::pow", "aten::remainder",
      "aten::fmod", "aten::maximum", "aten::minimum", "aten::atan2", "aten::true_divide"};
  // A parameter is a number if some arithmetic node reads it so and no node reads it as a tensor.
  std::vector<bool> as_number(parameters.size(), false), as_tensor(parameters.size(), false);
  for (const torch::lazy::Node* n : post_order) {
    const bool arith = n->num_outputs() > 0 && arithmetic.count(n->op().op.toQualString()) > 0;
    for (const torch::lazy::Output& operand : n->operands()) {
      auto p = parameter_of_node.find(operand.node);
      if (p == parameter_of_node.end()) continue;
      const torch::lazy::Shape& s = operand.node->shape(operand.index);
      const bool wrapped = arith && s.dim() == 0 && s.scalar_type() == at::kDouble &&
                           n->shape(0).scalar_type() != at::kDouble;
      (wrapped ? as_number : as_tensor)[p->second] = true;
    }
  }
  std::vector<bool> numbers(parameters.size());
  for (size_t i = 0; i < numbers.size(); ++i) numbers[i] = as_number[i] && !as_tensor[i];
  return numbers;
}

// The flags of the graph last run through RunPostOrder on this thread, for the
// Compile that follows it within the same sync.
thread_local std::vector<bool> t_wrapped_numbers;

class GraphExecutor : public torch::lazy::LazyGraphExecutor {
 protected:
  PostOrderData RunPostOrder(const std::vector<torch::lazy::Value>& ir_values, SyncTensorCollection* coll) override {
    PostOrderData po = LazyGraphExecutor::RunPostOrder(ir_values, coll);
    coll->hash = torch::lazy::HashCombine(coll->hash, wiring_hash(po.post_order, ir_values));
    t_wrapped_numbers = wrapped_number_parameters(po.post_order, po.parameters_data);
    return po;
  }
};

} // namespace

std::vector<bool> wrapped_number_parameters_of_last_graph() {
  return t_wrapped_numbers;
}

void register_graph_executor() {
  static GraphExecutor executor;
  torch::lazy::LazyGraphExecutor::Register(&executor);
}

} // namespace my_device::lazy
