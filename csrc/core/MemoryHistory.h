#pragma once
// The device allocator's memory history, as CUDA's caching allocator keeps it
// for torch.cuda.memory._record_memory_history / _snapshot: while recording,
// each allocation keeps the stack that made it (shown by the snapshot's
// blocks), and every allocator action (alloc, free, segment alloc/free, OOM)
// is appended to a per-device trace, bounded by max_entries (oldest dropped).
// This file knows no Python: where stacks come from is a callback installed by
// the bindings (csrc/python/MemorySnapshot.cpp).
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace my_device {

using StackContext = std::shared_ptr<c10::GatheredContext>;
using StackRecorder = StackContext (*)();

struct TraceEntry {
  // The actions of torch.cuda.memory._snapshot()'s TraceEntry, in its words.
  enum class Action : uint8_t { Alloc, FreeRequested, FreeCompleted, SegmentAlloc, SegmentFree, Oom, Snapshot };
  Action action;
  c10::DeviceIndex device;
  uintptr_t addr;         // 0 for oom/snapshot
  size_t size;
  uintptr_t stream;       // the runtime's stream handle (0: the default stream)
  size_t device_free;     // oom only: what the runtime reported free
  int64_t time_us;        // wall clock, as CUDA's entries
  StackContext context;   // the stack of the call that caused it, if recorded
};

struct MemoryHistoryConfig {
  bool enabled = false;        // keep stacks of live blocks
  bool trace = false;          // append TraceEntry records ("all"), not just state ("state")
  bool free_context = false;   // record the stack of frees too (context="all")
  bool alloc_context = true;   // record the stack of allocations (context "alloc"/"all"; "state" too)
  size_t max_entries = SIZE_MAX;
  StackRecorder recorder = nullptr;
};

void set_memory_history(const MemoryHistoryConfig& config, bool clear);
MemoryHistoryConfig memory_history();
// Whether anything is being recorded. Asked by every allocation and free, so
// it is a relaxed load inlined at the call, as are the first checks below.
namespace detail {
extern std::atomic<bool> g_recording_memory_history;
StackContext gather_context(bool free);
}  // namespace detail
inline bool recording_memory_history() {
  return detail::g_recording_memory_history.load(std::memory_order_relaxed);
}
// The stack of the current call, if recording with a recorder (null otherwise,
// and always inside kernels: a stream worker has no Python stack).
inline StackContext gather_alloc_context() {
  return recording_memory_history() ? detail::gather_context(false) : nullptr;
}
inline StackContext gather_free_context() {
  return recording_memory_history() ? detail::gather_context(true) : nullptr;
}
void record_trace(TraceEntry entry);
// The trace of `device` so far, oldest first.
std::vector<TraceEntry> device_trace(c10::DeviceIndex device);

} // namespace my_device
