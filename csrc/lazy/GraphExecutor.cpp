// The Lazy graph executor of mydev: LTC's own, with a graph hash that tells
// apart graphs whose nodes are wired differently.
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
#include <torch/csrc/lazy/core/hash.h>
#include <torch/csrc/lazy/core/ir.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>

#include <cstdint>
#include <unordered_map>

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

class GraphExecutor : public torch::lazy::LazyGraphExecutor {
 protected:
  PostOrderData RunPostOrder(const std::vector<torch::lazy::Value>& ir_values, SyncTensorCollection* coll) override {
    PostOrderData po = LazyGraphExecutor::RunPostOrder(ir_values, coll);
    coll->hash = torch::lazy::HashCombine(coll->hash, wiring_hash(po.post_order, ir_values));
    return po;
  }
};

} // namespace

void register_graph_executor() {
  static GraphExecutor executor;
  torch::lazy::LazyGraphExecutor::Register(&executor);
}

} // namespace my_device::lazy
