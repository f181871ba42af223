// Stream capture and graphs (mydev_runtime.h, "graphs").
//
// A capture is a list of nodes in the order they were enqueued, each with the
// nodes it depends on: the previous node of its stream and, through events,
// the positions of other streams it waited for. Enqueue order is a valid run
// order (a wait can only name a record made before it), so a replay is one
// task that runs the nodes one after another; the dependencies are kept to
// check joins at the end of capture and to draw the graph. Nodes whose callers
// declared the memory they touch are ordered by that memory instead, and a
// replay runs independent ones on more than one thread (graph_replay.cpp).
#include "graph_state.h"
#include "stream_state.h"

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace mydev_detail {
namespace {

struct Capture {
  uint64_t id;
  int device;
  mydevStreamCaptureMode mode;
  std::thread::id thread;
  const mydevStream_st* origin;
  std::vector<Node> nodes;
  // Every stream taking part (the origin first) and its position: the nodes
  // its next node will depend on.
  std::vector<std::pair<std::shared_ptr<mydevStream_st>, std::vector<uint32_t>>> streams;
  bool invalidated = false;
  Objects objects;

  std::vector<uint32_t>& frontier(const mydevStream_st& s) {
    for (auto& entry : streams) {
      if (entry.first.get() == &s) return entry.second;
    }
    std::abort();  // a stream with this capture's id is always listed
  }
};

constexpr int kMaxCaptureDevices = 64;

struct Registry {
  std::mutex mu;
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Capture>> captures;
  // Per device, the active captures that refuse device-wide waits (global and
  // thread-local ones): device-wide waits look here without the lock.
  std::atomic<int> refusing[kMaxCaptureDevices] = {};
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: streams may outlive static destruction
  return *r;
}

// Caller holds the registry lock.
Capture* captureOf(Registry& r, uint64_t id) {
  auto it = r.captures.find(id);
  return it == r.captures.end() ? nullptr : it->second.get();
}

void addUnique(std::vector<uint32_t>& into, const std::vector<uint32_t>& more) {
  for (uint32_t n : more) {
    if (std::find(into.begin(), into.end(), n) == into.end()) into.push_back(n);
  }
}

}  // namespace
}  // namespace mydev_detail

using namespace mydev_detail;

namespace mydev_detail {

mydevError_t captureTask(const std::shared_ptr<mydevStream_st>& sp, Task&& task) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Capture* c = captureOf(r, streamCaptureId(*sp));
  if (!c) return mydevErrorStreamCaptureInvalidated;  // its capture ended meanwhile
  if (c->invalidated) return mydevErrorStreamCaptureInvalidated;
  std::vector<uint32_t>& position = c->frontier(*sp);
  if (task.kind == Task::Kind::kEventRecord) {
    std::lock_guard<std::mutex> marker(task.marker->mu);
    task.marker->capture_id = c->id;
    task.marker->capture_frontier = position;
    return mydevSuccess;
  }
  if (task.kind != Task::Kind::kLaunch && task.kind != Task::Kind::kCopy && task.kind != Task::Kind::kMemset) {
    c->invalidated = true;
    return mydevErrorStreamCaptureUnsupported;
  }
  const auto index = static_cast<uint32_t>(c->nodes.size());
  task.traced = false;
  task.waiter = nullptr;
  Node node{std::move(task), position, reinterpret_cast<uintptr_t>(sp.get())};
  if (node.task.kind != Task::Kind::kLaunch) {
    // A copy or a memset declares itself: what it writes and reads, at the
    // device addresses launches declare (its own are kernel addresses).
    auto range = [](const void* kernel_address, size_t bytes, bool written) {
      const auto begin = reinterpret_cast<uintptr_t>(mydevDeviceAddress(kernel_address));
      return Node::Range{begin, begin + bytes, written};
    };
    node.declared = true;
    node.memory.push_back(range(node.task.ptr, node.task.count, true));
    if (node.task.kind == Task::Kind::kCopy) node.memory.push_back(range(node.task.src, node.task.count, false));
  }
  c->nodes.push_back(std::move(node));
  position.assign(1, index);
  return mydevSuccess;
}

mydevError_t captureWait(const std::shared_ptr<mydevStream_st>& sp, const std::shared_ptr<EventMarker>& m) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t recorded_in;
  std::vector<uint32_t> frontier;
  bool done;
  {
    std::lock_guard<std::mutex> marker(m->mu);
    recorded_in = m->capture_id;
    frontier = m->capture_frontier;
    done = m->done;
  }
  const uint64_t waiting_in = streamCaptureId(*sp);
  Capture* waiter = waiting_in ? captureOf(r, waiting_in) : nullptr;
  if (recorded_in == 0) {
    // A capturing stream waiting for work outside the capture: a replay could
    // not wait for it. Nothing to wait for if it already ran.
    if (done) return mydevSuccess;
    if (waiter) waiter->invalidated = true;
    return mydevErrorStreamCaptureIsolation;
  }
  Capture* recorder = captureOf(r, recorded_in);
  if (!recorder) return mydevErrorStreamCaptureIsolation;  // its capture is over: no replay to wait for
  if (waiter && waiter != recorder) {
    waiter->invalidated = true;
    return mydevErrorStreamCaptureIsolation;
  }
  if (!waiter) {
    if (isDefaultStream(*sp)) {
      recorder->invalidated = true;
      return mydevErrorStreamCaptureUnsupported;
    }
    recorder->streams.emplace_back(sp, std::move(frontier));  // the stream joins the capture here
    setStreamCaptureId(*sp, recorder->id);
    return mydevSuccess;
  }
  if (recorder->invalidated) return mydevErrorStreamCaptureInvalidated;
  addUnique(recorder->frontier(*sp), frontier);
  return mydevSuccess;
}

mydevError_t refuseCapturedWait(const mydevStream_st& s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (Capture* c = captureOf(r, streamCaptureId(s))) c->invalidated = true;
  return mydevErrorStreamCaptureUnsupported;
}

mydevError_t checkDeviceWait(int device) {
  if (device < 0 || device >= kMaxCaptureDevices || onStreamWorker()) return mydevSuccess;
  Registry& r = registry();
  if (r.refusing[device].load(std::memory_order_acquire) == 0) return mydevSuccess;
  std::lock_guard<std::mutex> lock(r.mu);
  bool refused = false;
  for (auto& [id, c] : r.captures) {
    if (c->device != device || c->mode == mydevStreamCaptureModeRelaxed) continue;
    if (c->mode == mydevStreamCaptureModeThreadLocal && c->thread != std::this_thread::get_id()) continue;
    c->invalidated = true;
    refused = true;
  }
  return refused ? mydevErrorStreamCaptureUnsupported : mydevSuccess;
}

mydevError_t refuseCapturedEvent(const EventMarker& m) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (Capture* c = captureOf(r, m.capture_id)) c->invalidated = true;
  return mydevErrorCapturedEvent;
}

namespace {

template <class H>
struct Handles {
  std::mutex mu;
  std::unordered_set<H*> live;
  bool contains(H* h) {
    std::lock_guard<std::mutex> lock(mu);
    return live.count(h) != 0;
  }
};
Handles<mydevGraph_st>& graphs() {
  static auto* h = new Handles<mydevGraph_st>();
  return *h;
}
Handles<mydevGraphExec_st>& execs() {
  static auto* h = new Handles<mydevGraphExec_st>();
  return *h;
}

}  // namespace
}  // namespace mydev_detail

extern "C" {

mydevError_t mydevStreamBeginCapture(mydevStream_t stream, mydevStreamCaptureMode mode) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (mode != mydevStreamCaptureModeGlobal && mode != mydevStreamCaptureModeThreadLocal &&
      mode != mydevStreamCaptureModeRelaxed) {
    return mydevErrorInvalidValue;
  }
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  if (isDefaultStream(*s)) return mydevErrorStreamCaptureUnsupported;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (streamCaptureId(*s) != 0) return mydevErrorIllegalState;
  auto c = std::make_unique<Capture>();
  c->id = r.next_id++;
  c->device = streamDevice(*s);
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = s.get();
  c->streams.emplace_back(s, std::vector<uint32_t>{});
  if (mode != mydevStreamCaptureModeRelaxed && c->device < kMaxCaptureDevices) {
    r.refusing[c->device].fetch_add(1, std::memory_order_acq_rel);
  }
  setStreamCaptureId(*s, c->id);
  r.captures.emplace(c->id, std::move(c));
  return mydevSuccess;
}

mydevError_t mydevStreamEndCapture(mydevStream_t stream, mydevGraph_t* graph) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!graph) return mydevErrorInvalidValue;
  *graph = nullptr;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  Registry& r = registry();
  std::unique_ptr<Capture> c;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    Capture* found = captureOf(r, streamCaptureId(*s));
    if (!found) return mydevErrorIllegalState;  // not capturing
    if (found->origin != s.get()) return mydevErrorStreamCaptureUnmatched;
    if (found->mode == mydevStreamCaptureModeThreadLocal && found->thread != std::this_thread::get_id()) {
      return mydevErrorStreamCaptureWrongThread;
    }
    auto it = r.captures.find(found->id);
    c = std::move(it->second);
    r.captures.erase(it);
    for (auto& entry : c->streams) setStreamCaptureId(*entry.first, 0);
    if (c->mode != mydevStreamCaptureModeRelaxed && c->device < kMaxCaptureDevices) {
      r.refusing[c->device].fetch_sub(1, std::memory_order_acq_rel);
    }
  }
  mydevError_t err = c->invalidated ? mydevErrorStreamCaptureInvalidated : mydevSuccess;
  if (!err) {
    // Every stream's position must be behind the origin's: the nodes the
    // origin's position depends on, directly or not.
    std::vector<char> reached(c->nodes.size(), 0);
    std::vector<uint32_t> todo = c->streams.front().second;
    while (!todo.empty()) {
      const uint32_t n = todo.back();
      todo.pop_back();
      if (reached[n]) continue;
      reached[n] = 1;
      for (uint32_t d : c->nodes[n].deps) todo.push_back(d);
    }
    for (const auto& entry : c->streams) {
      for (uint32_t n : entry.second) {
        if (!reached[n]) err = mydevErrorStreamCaptureUnjoined;
      }
    }
  }
  if (err) {
    destroyObjects(c->objects);
    return err;
  }
  auto data = std::make_shared<GraphData>();
  data->device = c->device;
  data->nodes = std::move(c->nodes);
  data->objects = std::move(c->objects);
  auto* g = new mydevGraph_st{std::move(data)};
  {
    std::lock_guard<std::mutex> lock(graphs().mu);
    graphs().live.insert(g);
  }
  *graph = g;
  return mydevSuccess;
}

mydevError_t mydevStreamGetCaptureInfo(mydevStream_t stream, mydevStreamCaptureStatus* status,
                                       unsigned long long* id) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!status) return mydevErrorInvalidValue;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  const uint64_t capture = streamCaptureId(*s);
  *status = mydevStreamCaptureStatusNone;
  if (id) *id = 0;
  if (capture == 0) return mydevSuccess;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Capture* c = captureOf(r, capture);
  if (!c) return mydevSuccess;
  *status = c->invalidated ? mydevStreamCaptureStatusInvalidated : mydevStreamCaptureStatusActive;
  if (id) *id = capture;
  return mydevSuccess;
}

mydevError_t mydevStreamCaptureRetainObject(mydevStream_t stream, void* object, mydevUserObjectDestroy_t destroy) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!destroy) return mydevErrorInvalidValue;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Capture* c = captureOf(r, streamCaptureId(*s));
  if (!c) return mydevErrorIllegalState;
  c->objects.emplace_back(object, destroy);
  return mydevSuccess;
}

mydevError_t mydevStreamCaptureDeclareMemory(mydevStream_t stream, const mydevMemRange* ranges, size_t count) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (count != 0 && !ranges) return mydevErrorInvalidValue;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Capture* c = captureOf(r, streamCaptureId(*s));
  if (!c) return mydevErrorIllegalState;
  const std::vector<uint32_t>& position = c->frontier(*s);
  // The stream's last node: its position is that node alone right after it.
  if (position.size() != 1 || c->nodes[position[0]].stream_id != reinterpret_cast<uintptr_t>(s.get()) ||
      c->nodes[position[0]].task.kind != Task::Kind::kLaunch) {
    return mydevErrorIllegalState;
  }
  Node& node = c->nodes[position[0]];
  node.memory.clear();
  for (size_t i = 0; i < count; ++i) {
    const auto begin = reinterpret_cast<uintptr_t>(ranges[i].ptr);
    if (ranges[i].bytes != 0) node.memory.push_back({begin, begin + ranges[i].bytes, ranges[i].written != 0});
  }
  node.declared = true;
  return mydevSuccess;
}

mydevError_t mydevGraphGetNodeCount(mydevGraph_t graph, size_t* count) {
  if (!count) return mydevErrorInvalidValue;
  if (!graph || !graphs().contains(graph)) return mydevErrorInvalidResourceHandle;
  *count = graph->data->nodes.size();
  return mydevSuccess;
}

mydevError_t mydevGraphDebugDotPrint(mydevGraph_t graph, const char* path) {
  if (!path) return mydevErrorInvalidValue;
  if (!graph || !graphs().contains(graph)) return mydevErrorInvalidResourceHandle;
  FILE* f = std::fopen(path, "w");
  if (!f) return mydevErrorInvalidValue;
  const auto& nodes = graph->data->nodes;
  std::fprintf(f, "digraph mydev_graph {\n  // device %d, %zu nodes, run in the order of their numbers\n",
               graph->data->device, nodes.size());
  std::unordered_map<uint64_t, int> stream_numbers;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Task& t = nodes[i].task;
    const int stream = stream_numbers.emplace(nodes[i].stream_id, static_cast<int>(stream_numbers.size())).first->second;
    std::string label = t.kind == Task::Kind::kCopy ? std::string("copy ") + t.label + " " + std::to_string(t.count) + " B"
                        : t.kind == Task::Kind::kMemset ? "memset " + std::to_string(t.count) + " B"
                        : t.label[0] ? std::string(t.label) : std::string("launch");
    std::string escaped;
    for (char ch : label) {
      if (ch == '"' || ch == '\\') escaped.push_back('\\');
      escaped.push_back(ch);
    }
    std::fprintf(f, "  n%zu [label=\"%zu: %s\\nstream %d\"];\n", i, i, escaped.c_str(), stream);
    for (uint32_t d : nodes[i].deps) std::fprintf(f, "  n%u -> n%zu;\n", d, i);
  }
  std::fprintf(f, "}\n");
  return std::fclose(f) == 0 ? mydevSuccess : mydevErrorInvalidValue;
}

mydevError_t mydevGraphDestroy(mydevGraph_t graph) {
  if (!graph) return mydevErrorInvalidResourceHandle;
  {
    std::lock_guard<std::mutex> lock(graphs().mu);
    if (!graphs().live.erase(graph)) return mydevErrorInvalidResourceHandle;
  }
  delete graph;  // the data stays while an executable made from it lives
  return mydevSuccess;
}

mydevError_t mydevGraphInstantiate(mydevGraphExec_t* exec, mydevGraph_t graph) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!exec) return mydevErrorInvalidValue;
  if (!graph || !graphs().contains(graph)) return mydevErrorInvalidResourceHandle;
  auto* x = new mydevGraphExec_st();
  x->data = graph->data;
  planReplay(*x);
  {
    std::lock_guard<std::mutex> lock(execs().mu);
    execs().live.insert(x);
  }
  *exec = x;
  return mydevSuccess;
}

mydevError_t mydevGraphLaunch(mydevGraphExec_t exec, mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!exec || !execs().contains(exec)) return mydevErrorInvalidResourceHandle;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  if (streamDevice(*s) != exec->data->device) return mydevErrorInvalidValue;
  if (streamCaptureId(*s) != 0) return mydevErrorIllegalState;  // no graphs inside graphs
  {
    std::lock_guard<std::mutex> lock(exec->mu);
    ++exec->in_flight;
  }
  auto* replay = new Replay{exec};
  const mydevError_t err = mydevLaunchHostFuncLabeled(s.get(), runReplay, replay, "graph replay");
  if (err != mydevSuccess && err != mydevErrorLaunchFailure) {
    delete replay;
    std::lock_guard<std::mutex> lock(exec->mu);
    --exec->in_flight;
  }
  return err;
}

mydevError_t mydevGraphExecDestroy(mydevGraphExec_t exec) {
  if (!exec) return mydevErrorInvalidResourceHandle;
  {
    std::lock_guard<std::mutex> lock(execs().mu);
    if (!execs().live.erase(exec)) return mydevErrorInvalidResourceHandle;
  }
  {
    // Replays still queued run the nodes, whose data the executable holds.
    // (At process exit queued work is dropped: nothing to wait for.)
    std::unique_lock<std::mutex> lock(exec->mu);
    while (exec->in_flight > 0 && !runtimeExiting()) exec->idle.wait_for(lock, std::chrono::milliseconds(10));
  }
  delete exec;
  return mydevSuccess;
}

}  // extern "C"
