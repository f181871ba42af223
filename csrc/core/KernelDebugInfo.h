#pragma once
// The thread-local debug info kernels on stream workers run under: how the
// memory events of allocations made inside kernels reach a profile.
//
// (In core, not profiler/: the allocator reads it, and the profiler's Kineto
// session, a layer above, sets it.)
//
// PyTorch's profiler keeps its state in the profiling thread's thread-local
// debug info (c10::ThreadLocalDebugInfo, PROFILER_STATE), and the allocator
// reports through c10::reportMemoryUsageToProfiler, which looks there. A
// stream worker has no such state: the scratch memory a queued kernel's CPU
// code allocates (through the redirecting CPU allocator, in device memory)
// went unreported. While a device profile with profile_memory=True runs (the
// mydev Kineto session, ActivityProfiler.cpp), the session keeps the profiling
// thread's debug info here, and the allocator, on a worker, reports under it.
#include <c10/util/ThreadLocalDebugInfo.h>

#include <memory>

namespace my_device {

// Called by the Kineto session on the profiling thread when it starts and stops.
void capture_profiler_state_for_kernels();
void release_profiler_state_for_kernels();
// The captured debug info, or null (one relaxed atomic load when no profile runs).
std::shared_ptr<c10::ThreadLocalDebugInfo> profiler_state_for_kernels();

} // namespace my_device
