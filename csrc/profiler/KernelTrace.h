#pragma once
// The device's record of the work it ran, for the profiler, from the runtime's
// activity tracing (mydevActivitySetCallback, as CUPTI's activity API is for
// CUDA): while tracing, each kernel (a queued launch, or an op run at the call
// in stream order), copy and memset that ran on a stream leaves a
// KernelRecord: its label (the op, for kernels), device, stream, start and end
// on the device, and the correlation id of the profiled op that launched it,
// so that a profiler can attach it to its op.
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace my_device {

struct KernelRecord {
  enum class Kind : uint8_t { Kernel, Memcpy, Memset };
  Kind kind;
  std::string name;      // the launch's label; "" for work launched without one
  c10::DeviceIndex device;
  int64_t stream;        // the c10::Stream id (torch.mydev.Stream.stream_id)
  uint64_t correlation;  // of the innermost profiled op on the launching thread; 0 if none
  int64_t start_ns;      // wall clock (ns since the Unix epoch), the profiler's time base
  int64_t end_ns;
  size_t bytes;          // copies and memsets
  bool at_the_call;      // run by the calling thread in stream order, not queued
};

// Starts collecting (dropping what an earlier trace left), and stops, handing over the records.
void start_kernel_tracing();
std::vector<KernelRecord> stop_kernel_tracing();

// The profiler's correlation ids, per host thread (pushed on op entry, popped on exit).
void push_correlation(uint64_t id);
void pop_correlation();
// While tracing: the correlation id of the op that was running when op `id`
// was entered on the same thread (its caller), 0 if none.
uint64_t caller_correlation(uint64_t id);

} // namespace my_device
