#include "Graph.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GraphImplInterface.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "Allocator.h"
#include "Device.h"
#include "Exception.h"
#include "Generator.h"
#include "Launch.h"
#include "Stream.h"

namespace my_device {

bool stream_capturing(mydevStream_t stream, unsigned long long* capture_id) {
  mydevStreamCaptureStatus status = mydevStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (mydevStreamGetCaptureInfo(stream, &status, &id) != mydevSuccess) return false;
  if (capture_id) *capture_id = id;
  return status != mydevStreamCaptureStatusNone;
}

bool current_stream_capturing(c10::DeviceIndex device) {
  return capture_underway() && stream_capturing(current_stream_handle(device));
}

namespace {

// The random kernels of one capture: each drew a CPU engine, the k-th of its
// generator's draws in the capture. A replay reserves as many offsets of each
// generator as the capture drew, and reseeds each engine as eager's k-th draw
// from there would have been seeded (Generator.h, engine_seed).
struct CapturedRng {
  std::vector<at::Generator> generators;
  std::vector<uint64_t> draws;  // per generator
  struct Engine {
    at::Generator engine;
    size_t generator;
    uint64_t k;
  };
  std::vector<Engine> engines;
};

std::mutex g_rng_mutex;
std::unordered_map<unsigned long long, CapturedRng> g_captured_rng;

CapturedRng take_captured_rng(unsigned long long capture_id) {
  std::lock_guard<std::mutex> lock(g_rng_mutex);
  auto it = g_captured_rng.find(capture_id);
  if (it == g_captured_rng.end()) return {};
  CapturedRng rng = std::move(it->second);
  g_captured_rng.erase(it);
  return rng;
}

mydevStreamCaptureMode runtime_mode(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal:
      return mydevStreamCaptureModeThreadLocal;
    case at::GraphCaptureMode::Relaxed:
      return mydevStreamCaptureModeRelaxed;
    default:
      return mydevStreamCaptureModeGlobal;  // CUDA's default too
  }
}

class GraphImpl final : public at::GraphImplInterface {
 public:
  explicit GraphImpl(const at::GraphImplArgs& args) : keep_graph_(args.keep_graph) {}
  ~GraphImpl() override {
    try {
      reset();
    } catch (...) {
    }
  }

  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode mode) override {
    TORCH_CHECK(!has_graph_ && !capturing_,
                "This MyDevGraph instance already owns a captured graph. To capture a new graph, create a new "
                "instance (or reset() this one).");
    device_ = current_device();
    const c10::Stream stream = current_stream(device_);
    TORCH_CHECK(stream != default_stream(device_),
                "mydev graphs must be captured on a non-default stream. (However, after capture, it's ok to "
                "replay them on the default stream.)");
    stream_ = stream_handle(stream);
    pool_ = (pool.first != 0 || pool.second != 0) ? pool : new_pool_id(/*user_created=*/false);
    retain_pool(device_, pool_);
    const mydevError_t err = mydevStreamBeginCapture(stream_, runtime_mode(mode));
    if (err != mydevSuccess) {
      release_pool(device_, pool_);
      MYDEV_CHECK(err);
    }
    stream_capturing(stream_, &capture_id_);
    begin_allocate_to_pool(device_, pool_, capture_id_);
    captures_underway().fetch_add(1);
    capturing_ = true;
  }

  void capture_end() override {
    TORCH_CHECK(capturing_, "MyDevGraph::capture_end without a capture_begin");
    mydevGraph_t graph = nullptr;
    const mydevError_t err = mydevStreamEndCapture(stream_, &graph);
    if (err == mydevErrorStreamCaptureUnmatched || err == mydevErrorStreamCaptureWrongThread) {
      MYDEV_CHECK(err);  // still capturing: the caller ends it from the right stream or thread
    }
    rng_ = leave_capture();
    if (err != mydevSuccess) {
      // (The runtime destroyed the captured kernels: their memory went back to the pool.)
      rng_ = {};
      release_pool(device_, pool_);
      MYDEV_CHECK(err);
    }
    graph_ = graph;
    has_graph_ = true;
    if (!keep_graph_) {
      instantiate();
      if (!debug_) {
        MYDEV_CHECK(mydevGraphDestroy(graph_));
        graph_ = nullptr;
      }
    }
  }

  // What ending a capture undoes, whether it succeeded or was abandoned; returns
  // the random engines the capture used.
  CapturedRng leave_capture() {
    capturing_ = false;
    captures_underway().fetch_sub(1);
    end_allocate_to_pool(device_, pool_);
    return take_captured_rng(capture_id_);
  }

  void instantiate() override {
    TORCH_CHECK(has_graph_, "Called MyDevGraph::instantiate without a preceding successful capture.");
    TORCH_CHECK(graph_ != nullptr, "MyDevGraph::instantiate: the captured graph was not kept (keep_graph=False)");
    if (exec_) {
      MYDEV_CHECK(mydevGraphExecDestroy(exec_));
      exec_ = nullptr;
    }
    MYDEV_CHECK(mydevGraphInstantiate(&exec_, graph_));
  }

  void replay() override {
    TORCH_CHECK(has_graph_, "Called MyDevGraph::replay without a preceding successful capture.");
    if (!exec_) instantiate();
    if (!rng_.engines.empty()) reseed_engines();
    // The current stream of the graph's device, whichever device is current.
    finish_launch(device_, mydevGraphLaunch(exec_, current_stream_handle(device_)));
  }

  void reset() override {
    if (capturing_) {
      // Abandons the capture: what it recorded is destroyed with it.
      mydevGraph_t graph = nullptr;
      if (mydevStreamEndCapture(stream_, &graph) == mydevSuccess) mydevGraphDestroy(graph);
      leave_capture();
      has_graph_ = true;  // (releases the pool below)
    }
    if (exec_) {
      MYDEV_CHECK(mydevGraphExecDestroy(exec_));  // waits for its queued replays
      exec_ = nullptr;
    }
    if (graph_) {
      MYDEV_CHECK(mydevGraphDestroy(graph_));
      graph_ = nullptr;
    }
    if (has_graph_) release_pool(device_, pool_);
    has_graph_ = false;
    rng_ = {};
  }

  at::MempoolId_t pool() const override {
    TORCH_CHECK(has_graph_ || capturing_,
                "Called MyDevGraph::pool without a preceding successful capture.");
    return pool_;
  }

  void enable_debug_mode() override {
    debug_ = true;
  }

  void debug_dump(const std::string& path) override {
    TORCH_CHECK(graph_ != nullptr,
                "MyDevGraph::debug_dump: no graph is kept; call enable_debug_mode() before the capture ends");
    MYDEV_CHECK(mydevGraphDebugDotPrint(graph_, path.c_str()));
  }

 private:
  // Before the replay, in stream order: the engines start where eager's
  // draws would start now, and the generators move past them.
  void reseed_engines() {
    std::vector<std::pair<uint64_t, uint64_t>> starts;  // (seed, first offset) per generator
    for (size_t g = 0; g < rng_.generators.size(); ++g) {
      starts.push_back(reserve_offsets(rng_.generators[g], rng_.draws[g]));
    }
    std::vector<std::pair<at::Generator, uint64_t>> seeds;
    seeds.reserve(rng_.engines.size());
    for (const auto& e : rng_.engines) {
      seeds.emplace_back(e.engine, engine_seed(starts[e.generator].first, starts[e.generator].second + e.k));
    }
    launch_async(device_, "graph rng", [seeds = std::move(seeds)]() mutable {
      for (auto& [engine, seed] : seeds) {
        std::lock_guard<std::mutex> lock(engine.mutex());
        engine.set_current_seed(seed);
      }
    });
  }

  const bool keep_graph_;
  bool debug_ = false;
  bool capturing_ = false;
  bool has_graph_ = false;
  c10::DeviceIndex device_ = 0;
  mydevStream_t stream_ = nullptr;
  unsigned long long capture_id_ = 0;
  at::MempoolId_t pool_{0, 0};
  mydevGraph_t graph_ = nullptr;
  mydevGraphExec_t exec_ = nullptr;
  CapturedRng rng_;
};

} // namespace

at::Generator capture_engine(unsigned long long capture_id, const at::Generator& mydev_generator) {
  std::lock_guard<std::mutex> lock(g_rng_mutex);
  CapturedRng& rng = g_captured_rng[capture_id];
  size_t g = 0;
  while (g < rng.generators.size() &&
         rng.generators[g].unsafeGetGeneratorImpl() != mydev_generator.unsafeGetGeneratorImpl()) {
    ++g;
  }
  if (g == rng.generators.size()) {
    rng.generators.push_back(mydev_generator);
    rng.draws.push_back(0);
  }
  at::Generator engine = at::make_generator<at::CPUGeneratorImpl>(0);  // seeded at each replay
  rng.engines.push_back({engine, g, rng.draws[g]++});
  return engine;
}

void register_graph_impl() {
  static std::once_flag once;
  std::call_once(once, [] {
    // PyTorch looks the implementation up by c10::DeviceTypeName(type, false):
    // for a renamed PrivateUse1 that is the new name (upper case), not the
    // "PrivateUse1" that REGISTER_GRAPH_IMPL(PrivateUse1, ...) would register.
    at::GraphImplRegistry()->Register(
        c10::DeviceTypeName(c10::DeviceType::PrivateUse1, /*lower_case=*/false),
        [](const at::GraphImplArgs& args) -> std::unique_ptr<at::GraphImplInterface> {
          return std::make_unique<GraphImpl>(args);
        });
  });
}

} // namespace my_device
