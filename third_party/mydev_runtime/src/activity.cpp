// Activity tracing: reports of work that ran on streams, for profilers
// (mydev_runtime.h, "Activity tracing").
#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>

#include "internal.h"

namespace mydev_detail {
namespace {
struct Callback {
  mydevActivityCallback_t fn = nullptr;
  void* user_data = nullptr;
};
std::mutex g_mu;
Callback g_callback;  // read under g_mu by activityEmit; the flag spares the lock while off
std::atomic<bool> g_enabled{false};
thread_local std::vector<uint64_t> t_correlation;
}  // namespace

bool activityEnabled() {
  return g_enabled.load(std::memory_order_relaxed);
}

uint64_t activityCorrelation() {
  return t_correlation.empty() ? 0 : t_correlation.back();
}

int64_t activityClockNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void activityEmit(const mydevActivityRecord& record) {
  Callback cb;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    cb = g_callback;
  }
  if (cb.fn) cb.fn(&record, cb.user_data);
}

}  // namespace mydev_detail

using namespace mydev_detail;

extern "C" {

mydevError_t mydevActivitySetCallback(mydevActivityCallback_t callback, void* user_data) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_callback = {callback, user_data};
  g_enabled.store(callback != nullptr, std::memory_order_relaxed);
  return mydevSuccess;
}

mydevError_t mydevActivityPushExternalCorrelationId(uint64_t id) {
  t_correlation.push_back(id);
  return mydevSuccess;
}

mydevError_t mydevActivityPopExternalCorrelationId(uint64_t* id) {
  if (t_correlation.empty()) return mydevErrorInvalidValue;
  if (id) *id = t_correlation.back();
  t_correlation.pop_back();
  return mydevSuccess;
}

}  // extern "C"
