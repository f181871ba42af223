#pragma once
// The device allocator's state as torch.cuda.memory._snapshot() describes
// CUDA's: every segment the allocator holds from the runtime, split into its
// blocks. Built by the allocator (Allocator.cpp); turned into Python
// dictionaries by python/MemorySnapshot.cpp.
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "MemoryHistory.h"

namespace my_device {

struct BlockSnapshot {
  enum class State : uint8_t { ActiveAllocated, ActiveAwaitingFree, Inactive };
  uintptr_t address;
  size_t size;
  size_t requested_size;  // 0 for inactive blocks
  State state;
  StackContext context;   // the allocation's stack, while memory history is recorded
};

struct SegmentSnapshot {
  c10::DeviceIndex device;
  uintptr_t address;
  size_t total_size;
  uintptr_t stream;       // the runtime's stream handle; 0: the default stream, 1: kernels' own pool
  bool small;             // from the small (<= 1 MiB) pool
  size_t allocated_size;
  size_t active_size;
  std::vector<BlockSnapshot> blocks;
};

// Every device's segments, after recording a "snapshot" action in the history.
std::vector<SegmentSnapshot> memory_snapshot();

} // namespace my_device
