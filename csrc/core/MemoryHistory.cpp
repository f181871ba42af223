#include "MemoryHistory.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "Launch.h"

namespace my_device {
namespace {
std::mutex g_mutex;
MemoryHistoryConfig g_config;
std::unordered_map<c10::DeviceIndex, std::deque<TraceEntry>> g_traces;

StackContext gather(bool wanted) {
  if (!wanted || in_kernel()) return nullptr;
  StackRecorder recorder = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_config.enabled) return nullptr;
    recorder = g_config.recorder;
  }
  return recorder != nullptr ? recorder() : nullptr;
}
} // namespace

std::atomic<bool> detail::g_recording_memory_history{false};

void set_memory_history(const MemoryHistoryConfig& config, bool clear) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_config = config;
  if (clear || !config.enabled) g_traces.clear();
  for (auto& [device, trace] : g_traces) {
    while (trace.size() > config.max_entries) trace.pop_front();
  }
  detail::g_recording_memory_history.store(config.enabled, std::memory_order_release);
}

MemoryHistoryConfig memory_history() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_config;
}

StackContext detail::gather_context(bool free) {
  const MemoryHistoryConfig config = memory_history();
  return gather(free ? config.free_context : config.alloc_context);
}

void record_trace(TraceEntry entry) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_config.enabled || !g_config.trace || g_config.max_entries == 0) return;
  entry.time_us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  auto& trace = g_traces[entry.device];
  if (trace.size() >= g_config.max_entries) trace.pop_front();
  trace.push_back(std::move(entry));
}

std::vector<TraceEntry> device_trace(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_traces.find(device);
  if (it == g_traces.end()) return {};
  return {it->second.begin(), it->second.end()};
}

} // namespace my_device
