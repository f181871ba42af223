// Graph replays (mydev_runtime.h, "graphs"): the nodes of an executable graph
// run in capture order, or, where their memory is declared, on more than one
// thread in an order that keeps every node after those that touch its memory
// (planReplay).
#include "graph_state.h"
#include "stream_state.h"

#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

namespace mydev_detail {
namespace {

// Whether one of the two nodes may write memory the other touches.
bool touchSameMemory(const Node& a, const Node& b) {
  for (const auto& x : a.memory) {
    for (const auto& y : b.memory) {
      if ((x.written || y.written) && x.begin < y.end && y.begin < x.end) return true;
    }
  }
  return false;
}

void runNode(Node& node) {
  Task& t = node.task;
  int rc = 0;
  switch (t.kind) {
    case Task::Kind::kLaunch:
      try {
        rc = t.fn(t.ptr);
      } catch (abi::__forced_unwind&) {
        throw;
      } catch (...) {
        rc = -1;
      }
      break;
    case Task::Kind::kCopy:
      std::memmove(t.ptr, t.src, t.count);  // kernel addresses, as a queued copy's
      break;
    case Task::Kind::kMemset:
      std::memset(t.ptr, t.value, t.count);
      break;
    default:
      break;
  }
  if (rc != 0) recordWorkerFailure(t.label);
}

}  // namespace

// The order a replay must keep. Capture order is a valid run order; where two
// nodes declared disjoint memory (mydevStreamCaptureDeclareMemory) nothing
// orders them, as nothing orders two kernels on different streams: a replay
// may run them at the same time (copies and memsets declare themselves). An
// undeclared node (a launch whose caller declared nothing) waits for every
// node before it and every node after it waits for it.
void planReplay(mydevGraphExec_st& exec) {
  const std::vector<Node>& nodes = exec.data->nodes;
  const auto n = static_cast<uint32_t>(nodes.size());
  std::vector<std::vector<uint32_t>> successors(n);
  std::vector<uint32_t> waits_for(n, 0);
  bool chain = true;
  int64_t barrier = -1;  // the last undeclared node
  for (uint32_t j = 0; j < n; ++j) {
    auto order = [&](uint32_t i) {
      successors[i].push_back(j);
      ++waits_for[j];
    };
    if (!nodes[j].declared) {
      for (uint32_t i = static_cast<uint32_t>(std::max<int64_t>(barrier, 0)); i < j; ++i) order(i);
      barrier = j;
    } else {
      if (barrier >= 0) order(static_cast<uint32_t>(barrier));
      for (uint32_t i = static_cast<uint32_t>(barrier + 1); i < j; ++i) {
        if (touchSameMemory(nodes[i], nodes[j])) order(i);
      }
    }
    if (j > 0 && (waits_for[j] == 0 || std::find(successors[j - 1].begin(), successors[j - 1].end(), j) ==
                                           successors[j - 1].end())) {
      chain = false;
    }
  }
  if (chain || computeUnits().count < 2) return;
  exec.successors = std::move(successors);
  exec.waits_for = std::move(waits_for);
  using Parallel = mydevGraphExec_st::Parallel;
  exec.parallel = computeUnits().always ? Parallel::kYes : Parallel::kUnknown;
}

namespace {

// One parallel replay: the nodes whose predecessors have run, smallest first.
struct ParallelRun {
  mydevGraphExec_st* exec;
  std::mutex mu;
  std::condition_variable changed;
  std::vector<uint32_t> waiting;
  std::vector<uint32_t> ready;  // a min-heap
  size_t finished = 0;

  void work() {
    std::vector<Node>& nodes = exec->data->nodes;
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      changed.wait(lock, [&] { return !ready.empty() || finished == nodes.size(); });
      if (ready.empty()) return;
      std::pop_heap(ready.begin(), ready.end(), std::greater<>());
      const uint32_t n = ready.back();
      ready.pop_back();
      lock.unlock();
      runNode(nodes[n]);
      lock.lock();
      ++finished;
      for (uint32_t next : exec->successors[n]) {
        if (--waiting[next] == 0) {
          ready.push_back(next);
          std::push_heap(ready.begin(), ready.end(), std::greater<>());
        }
      }
      // This thread takes the next node itself: wake another only for a second.
      if (ready.size() > 1 || finished == nodes.size()) changed.notify_all();
    }
  }
};

// Whether running independent nodes side by side shortens a replay enough to
// pay for the hand-offs: the longest path through the plan, timed by the first
// replay, must be at most kParallelGain of the nodes' total time, and nodes
// must average at least kMinParallelNodeNs.
constexpr double kParallelGain = 0.9;
constexpr int64_t kMinParallelNodeNs = 10000;

bool worthRunningInParallel(const mydevGraphExec_st& exec, const std::vector<int64_t>& took) {
  const size_t n = took.size();
  int64_t total = 0;
  std::vector<int64_t> finish(n, 0);  // the longest path ending with each node
  for (size_t i = 0; i < n; ++i) {
    total += took[i];
    finish[i] += took[i];
    for (uint32_t next : exec.successors[i]) finish[next] = std::max(finish[next], finish[i]);
  }
  const int64_t longest = n ? *std::max_element(finish.begin(), finish.end()) : 0;
  return n > 0 && total / static_cast<int64_t>(n) >= kMinParallelNodeNs &&
         static_cast<double>(longest) <= kParallelGain * static_cast<double>(total);
}

void runParallel(mydevGraphExec_st* exec) {
  ParallelRun run;
  run.exec = exec;
  run.waiting = exec->waits_for;
  for (uint32_t i = 0; i < run.waiting.size(); ++i) {
    if (run.waiting[i] == 0) run.ready.push_back(i);
  }
  std::make_heap(run.ready.begin(), run.ready.end(), std::greater<>());
  runOnComputeUnits([](void* r) { static_cast<ParallelRun*>(r)->work(); }, &run);
}

}  // namespace

int runReplay(void* data) {
  using Parallel = mydevGraphExec_st::Parallel;
  std::unique_ptr<Replay> replay(static_cast<Replay*>(data));
  mydevGraphExec_st* exec = replay->exec;
  if (exec->parallel == Parallel::kYes) {
    runParallel(exec);
  } else if (exec->parallel == Parallel::kUnknown) {
    // The first replay runs in capture order and times its nodes: handing a
    // node to another thread costs a wake-up, more than a short kernel.
    std::vector<int64_t> took;
    took.reserve(exec->data->nodes.size());
    for (Node& node : exec->data->nodes) {
      const auto start = std::chrono::steady_clock::now();
      runNode(node);
      took.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
                         .count());
    }
    exec->parallel = worthRunningInParallel(*exec, took) ? Parallel::kYes : Parallel::kNo;
  } else {
    for (Node& node : exec->data->nodes) runNode(node);
  }
  {
    std::lock_guard<std::mutex> lock(exec->mu);
    --exec->in_flight;
  }
  exec->idle.notify_all();
  return 0;
}

}  // namespace mydev_detail
