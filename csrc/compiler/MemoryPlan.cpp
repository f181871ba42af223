#include "MemoryPlan.h"

#include <algorithm>
#include <numeric>

namespace my_device::compiler {

namespace {
// Every buffer starts on a cache line, as the caching allocator's blocks do,
// so a planned buffer is as aligned for vector loads as an allocated one.
constexpr size_t kAlignment = 64;

size_t aligned(size_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}
} // namespace

MemoryPlan plan_memory(const std::vector<BufferLife>& buffers) {
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
  std::vector<size_t> placed;
  for (size_t i : order) {
    const BufferLife& b = buffers[i];
    plan.naive_bytes += aligned(b.bytes);
    // The placed buffers alive at the same time as b, by offset.
    std::vector<size_t> live;
    for (size_t j : placed) {
      if (buffers[j].first <= b.last && b.first <= buffers[j].last) live.push_back(j);
    }
    std::sort(live.begin(), live.end(), [&](size_t x, size_t y) { return plan.offsets[x] < plan.offsets[y]; });
    size_t offset = 0;
    for (size_t j : live) {
      if (offset + aligned(b.bytes) <= plan.offsets[j]) break;  // fits in the gap before j
      offset = std::max(offset, plan.offsets[j] + aligned(buffers[j].bytes));
    }
    plan.offsets[i] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + aligned(b.bytes));
    placed.push_back(i);
  }
  return plan;
}

} // namespace my_device::compiler
