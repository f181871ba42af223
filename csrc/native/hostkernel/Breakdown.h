#pragma once
// Where a host-kernel call's host time goes, stage by stage, for
// bench/bench_launch.py --breakdown (my_device._C._host_kernel_breakdown).
// Off by default; then a stage mark costs one relaxed load.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace my_device::breakdown {

enum Stage : int {
  kDeviceScan,  // finding the call's device (HostKernel.cpp)
  kPlan,        // the op's plan and the dtype checks
  kKey,         // building the call's signature
  kMeta,        // the Meta cache lookup (or, on a miss, the Meta kernel and argument checks)
  kOutputs,     // allocating the outputs
  kJob,         // the queued kernel's own references to its arguments
  kLaunch,      // launch_async: destroying finished kernels, creating and enqueueing the task
  kInline,      // calls run at the call instead, whole
  kStages
};

extern std::atomic<bool> g_enabled;

void add(Stage stage, int64_t ns);
// Per stage: (name, total ns), then ("queued", calls), ("inline", calls) and
// ("host_aliases", count); resets the totals.
std::vector<std::pair<std::string, int64_t>> take();
void count(bool queued);
// A host alias made for a kernel outside TensorIterator run at the call
// (HostOperands, StructuredKernel.h): tests tell by it whether the kernel ran
// over the caller's own tensors instead (RunsOnDeviceTensors).
void count_host_alias();

// Marks the end of each stage on this thread.
class Clock {
 public:
  Clock() : on_(g_enabled.load(std::memory_order_relaxed)) {
    if (on_) last_ = now();
  }
  void mark(Stage stage) {
    if (!on_) return;
    const int64_t t = now();
    add(stage, t - last_);
    last_ = t;
  }
  bool on() const {
    return on_;
  }

 private:
  static int64_t now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  bool on_;
  int64_t last_ = 0;
};

} // namespace my_device::breakdown
