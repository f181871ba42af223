#include "Breakdown.h"

namespace my_device::breakdown {
namespace {

std::atomic<int64_t> g_ns[kStages];
std::atomic<int64_t> g_queued{0}, g_inline{0}, g_host_aliases{0};
constexpr const char* kNames[kStages] = {"device_scan", "plan", "key", "meta", "outputs", "job", "launch", "inline"};

} // namespace

std::atomic<bool> g_enabled{false};

void add(Stage stage, int64_t ns) {
  g_ns[stage].fetch_add(ns, std::memory_order_relaxed);
}

void count(bool queued) {
  if (g_enabled.load(std::memory_order_relaxed)) (queued ? g_queued : g_inline).fetch_add(1, std::memory_order_relaxed);
}

void count_host_alias() {
  if (g_enabled.load(std::memory_order_relaxed)) g_host_aliases.fetch_add(1, std::memory_order_relaxed);
}

std::vector<std::pair<std::string, int64_t>> take() {
  std::vector<std::pair<std::string, int64_t>> out;
  for (int s = 0; s < kStages; ++s) out.emplace_back(kNames[s], g_ns[s].exchange(0));
  out.emplace_back("queued", g_queued.exchange(0));
  out.emplace_back("inline", g_inline.exchange(0));
  out.emplace_back("host_aliases", g_host_aliases.exchange(0));
  return out;
}

} // namespace my_device::breakdown
