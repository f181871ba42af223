#pragma once
// Buffers of a program laid out in one arena by liveness: a buffer whose last
// reader has run gives its bytes to buffers defined later, so a program
// needs the arena's size, not the sum of its intermediates.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace my_device::compiler {

struct BufferLife {
  size_t bytes;
  int first;  // the step that writes it
  int last;   // the last step that reads it (or a view of it)
};

struct MemoryPlan {
  std::vector<size_t> offsets;  // per buffer, in bytes, aligned
  size_t arena_bytes = 0;
  size_t naive_bytes = 0;       // the sum of all buffers: what the plan saves against
};

// Greedy by size, each buffer at the lowest offset free throughout its life.
MemoryPlan plan_memory(const std::vector<BufferLife>& buffers);

} // namespace my_device::compiler
