// What capture (graph.cpp) and replay (graph_replay.cpp) share: captured
// nodes, the graph that owns them, and executable graphs.
#pragma once

#include "internal.h"

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

struct mydevGraphExec_st;

namespace mydev_detail {

struct Node {
  Task task;  // kLaunch, kCopy or kMemset
  std::vector<uint32_t> deps;
  uint64_t stream_id;
  // mydevStreamCaptureDeclareMemory: all the device memory the node touches,
  // as [begin, end) address ranges. An undeclared node may touch anything.
  struct Range {
    uintptr_t begin, end;
    bool written;
  };
  bool declared = false;
  std::vector<Range> memory;
};

using Objects = std::vector<std::pair<void*, mydevUserObjectDestroy_t>>;

inline void destroyObjects(Objects& objects) {
  // Newest first: a later launch's data may refer to an earlier one's.
  for (auto it = objects.rbegin(); it != objects.rend(); ++it) it->second(it->first);
  objects.clear();
}

// The plan of a parallel replay for an executable graph (graph_replay.cpp).
void planReplay(mydevGraphExec_st& exec);
// The launched function of a replay: user_data is a new Replay, which it deletes.
struct Replay {
  mydevGraphExec_st* exec;
};
int runReplay(void* data);

}  // namespace mydev_detail

struct GraphData {
  using Node = mydev_detail::Node;
  using Objects = mydev_detail::Objects;
  int device;
  std::vector<Node> nodes;
  Objects objects;
  ~GraphData() { mydev_detail::destroyObjects(objects); }
};

struct mydevGraph_st {
  std::shared_ptr<GraphData> data;
};

struct mydevGraphExec_st {
  std::shared_ptr<GraphData> data;
  std::mutex mu;
  std::condition_variable idle;
  int in_flight = 0;  // replays enqueued and not yet finished
  // What a parallel replay runs by (mydev_detail::planReplay): each node's
  // successors and how many nodes it waits for. Empty when the nodes form a
  // chain, which runs one after another.
  std::vector<std::vector<uint32_t>> successors;
  std::vector<uint32_t> waits_for;
  // Whether replays run independent nodes side by side: decided by the first
  // replay (worthRunningInParallel).
  enum class Parallel { kNo, kUnknown, kYes };
  std::atomic<Parallel> parallel{Parallel::kNo};
};
