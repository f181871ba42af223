// Private interfaces shared between the runtime's source files. Nothing here is
// part of the contract in include/mydev_runtime.h.
#ifndef MYDEV_RUNTIME_INTERNAL_H
#define MYDEV_RUNTIME_INTERNAL_H

#include "mydev_runtime.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>

namespace mydev_detail {

// ---- device.cpp ----------------------------------------------------------
struct Config {
  int device_count;
  size_t memory_limit;
  bool strict;
};

// Parsed from the environment once, on first call. Does not initialise the
// runtime, so mydevGetDeviceCount can use it.
const Config& config();

// Lazy initialisation. Every entry point except the four "pure query" ones
// calls this first; it fails only in a child forked from an initialised parent.
mydevError_t ensureInitialized();
bool inPoisonedChild();

int currentDevice();
void setCurrentDevice(int device);  // caller has validated the index
bool validDevice(int device);

// ---- memory.cpp ----------------------------------------------------------
// Builds the registry eagerly so the fault handler never has to construct it.
void initMemoryRegistry();
// One side of a copy or memset, checked against the allocation registry.
struct RangeCheck {
  const void* ptr;
  size_t bytes;
  bool device;  // true: must lie in one device allocation; false: must avoid device memory
};
// Checks all ranges under one registry lock, in order; the first failure wins.
mydevError_t validateRanges(std::initializer_list<RangeCheck> ranges);

// Strict-mode access window (no-op otherwise). Scoped so an exception thrown
// through a launched function cannot leave device memory unprotected.
class AccessWindow {
 public:
  AccessWindow();
  ~AccessWindow();
  AccessWindow(const AccessWindow&) = delete;
  AccessWindow& operator=(const AccessWindow&) = delete;
};

struct FaultAllocation {
  uintptr_t base;
  size_t size;
  int device;
};
// For the SIGSEGV handler: never blocks indefinitely and allocates nothing.
bool findDeviceAllocationForSignal(uintptr_t addr, FaultAllocation* out);

// ---- strict_fault.cpp ------------------------------------------------------
void installStrictFaultHandler();

// ---- stream.cpp ----------------------------------------------------------
void initDefaultStreams();
// NULL resolves to the current device's default stream; anything else must be
// a live handle. The shared_ptr keeps the stream alive while work is submitted
// even if another thread destroys the handle meanwhile.
mydevError_t resolveStream(mydevStream_t handle, std::shared_ptr<mydevStream_st>* out);
int streamDevice(const mydevStream_st& stream);
// The one place work enters a stream. Work returns 0 on success; nonzero makes
// the submission fail with mydevErrorLaunchFailure and sets the sticky error.
mydevError_t submitToStream(mydevStream_st& stream, const std::function<int()>& work);
mydevError_t synchronizeDevice(int device);

}  // namespace mydev_detail

#endif  // MYDEV_RUNTIME_INTERNAL_H
