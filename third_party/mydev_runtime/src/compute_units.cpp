// The emulated device's compute units: the threads besides a stream's worker
// that run one launched task's independent work at the same time, as a GPU
// runs a kernel's blocks on its multiprocessors. Graph replays share their
// independent nodes among them (graph_replay.cpp), and a launched function
// shares its own work through mydevRunOnComputeUnits.
#include "stream_state.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace mydev_detail {
namespace {

// A task's work posted for the helpers to join.
struct Posted {
  void (*fn)(void*);
  void* data;
  mydevStream_st* stream;  // the task's stream and device: what a helper runs as
  int device;
  std::mutex mu;
  std::condition_variable left;
  int inside = 0;  // helpers running fn
};

// Helpers join whichever task posts its work first; a task posting while
// another's work is posted runs alone (a unit is busy: the hardware's answer
// too), which also keeps a helper that posts from inside fn from waiting for
// itself.
struct Helpers {
  std::mutex mu;
  std::condition_variable posted;
  Posted* work = nullptr;
  uint64_t generation = 0;
  std::atomic<uint64_t> published{0};  // `generation`, for helpers spinning without the lock

  explicit Helpers(int count) {
    for (int i = 0; i < count; ++i) std::thread([this] { loop(); }).detach();
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      Posted* p;
      {
        // A kernel that shares its work often shares the next one's too (a
        // model's products come in runs): a helper that blocked at once paid a
        // futex wake of about 30 us at each, a tenth of a product's half.
        spinUntil([&] { return published.load(std::memory_order_acquire) != seen; }, kHelperSpinNs);
        std::unique_lock<std::mutex> lock(mu);
        posted.wait(lock, [&] { return work != nullptr && generation != seen; });
        seen = generation;
        p = work;
        std::lock_guard<std::mutex> l(p->mu);
        ++p->inside;
      }
      mydevStream_st* const saved_stream = t_worker_stream;
      t_worker_stream = p->stream;
      {
        DeviceGuard on_device(p->device);
        p->fn(p->data);
      }
      t_worker_stream = saved_stream;
      std::lock_guard<std::mutex> l(p->mu);
      --p->inside;
      p->left.notify_all();
    }
  }
};

Helpers& helpers() {
  static auto* h = new Helpers(computeUnits().count - 1);  // never destroyed: detached threads use it
  return *h;
}

}  // namespace

// MYDEV_COMPUTE_UNITS: how many threads run one task's independent work, the
// stream's worker included. Unset: two, and each replay or caller decides from
// its first run whether its work is worth sharing; 1: only the worker; N > 1:
// N, always used.
ComputeUnits computeUnits() {
  static const ComputeUnits units = [] {
    const char* v = std::getenv("MYDEV_COMPUTE_UNITS");
    if (v == nullptr || *v == '\0') return ComputeUnits{2, false};
    return ComputeUnits{std::max(1, std::min(std::atoi(v), 64)), true};
  }();
  return units;
}

void runOnComputeUnits(void (*fn)(void*), void* data) {
  if (t_worker_stream == nullptr || computeUnits().count < 2) {
    fn(data);
    return;
  }
  Posted p{fn, data, t_worker_stream, currentDevice()};
  Helpers& h = helpers();
  bool posted = false;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    if (h.work == nullptr) {
      h.work = &p;
      ++h.generation;
      h.published.store(h.generation, std::memory_order_release);
      posted = true;
    }
  }
  if (posted) h.posted.notify_all();
  fn(data);
  if (!posted) return;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.work = nullptr;  // no helper joins from now on
  }
  std::unique_lock<std::mutex> lock(p.mu);
  p.left.wait(lock, [&] { return p.inside == 0; });
}

}  // namespace mydev_detail

extern "C" mydevError_t mydevRunOnComputeUnits(void (*fn)(void* user_data), void* user_data) {
  if (fn == nullptr) return mydevErrorInvalidValue;
  mydev_detail::runOnComputeUnits(fn, user_data);
  return mydevSuccess;
}

extern "C" mydevError_t mydevGetComputeUnits(int* count, int* asked) {
  if (count == nullptr || asked == nullptr) return mydevErrorInvalidValue;
  const mydev_detail::ComputeUnits units = mydev_detail::computeUnits();
  *count = units.count;
  *asked = units.always ? 1 : 0;
  return mydevSuccess;
}
