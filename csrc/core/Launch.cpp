#include "Launch.h"

#include <atomic>
#include <mutex>
#include <vector>
#include <unordered_map>

namespace my_device {
namespace {
std::mutex g_mutex;
std::unordered_map<c10::DeviceIndex, std::string> g_failures;  // the first unreported failure per device
std::string g_injected;
std::atomic<bool> g_any_injected{false};

std::mutex g_retired_mutex;
std::vector<LaunchedTask*> g_retired;
std::atomic<bool> g_any_retired{false};
} // namespace

void retire_kernel(LaunchedTask* task) {
  std::lock_guard<std::mutex> lock(g_retired_mutex);
  g_retired.push_back(task);
  g_any_retired.store(true, std::memory_order_release);
}

bool has_finished_kernels() {
  return g_any_retired.load(std::memory_order_acquire);
}

void reap_finished_kernels() {
  if (!g_any_retired.load(std::memory_order_acquire)) return;
  std::vector<LaunchedTask*> finished;
  {
    std::lock_guard<std::mutex> lock(g_retired_mutex);
    finished.swap(g_retired);
    g_any_retired.store(false, std::memory_order_relaxed);
  }
  for (LaunchedTask* task : finished) delete task;
}

void record_kernel_failure(c10::DeviceIndex device, const char* label, const std::string& what) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_failures.emplace(device, std::string(label) + ": " + what);  // keeps the first
}

std::string take_kernel_failure(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_failures.find(device);
  if (it == g_failures.end()) return {};
  std::string what = std::move(it->second);
  g_failures.erase(it);
  return what;
}

void inject_kernel_failure(const std::string& label) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_injected = label;
  g_any_injected.store(!label.empty());
}

bool take_injected_failure(const char* label) {
  if (!g_any_injected.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_injected.empty() || g_injected != label) return false;
  g_injected.clear();
  g_any_injected.store(false);
  return true;
}

} // namespace my_device
