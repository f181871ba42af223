// Device and pinned host memory: the allocation registry, per-device capacity
// accounting, and strict-mode page protection (access windows).
//
// Every allocation is its own anonymous mmap. That keeps device memory apart
// from the host heap (so a stray host pointer never aliases it), makes each
// allocation protectable on its own, and commits nothing up front: the limit
// is a number we account against, not memory we reserve.
#include "internal.h"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <vector>

namespace mydev_detail {
namespace {

struct Allocation {
  size_t size;    // as requested; bounds what copies may touch
  size_t mapped;  // page-rounded; what is accounted and protected
  int device;     // -1 for pinned host memory
  bool is_device() const { return device >= 0; }
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Allocation> allocations;  // keyed by base address
  std::vector<size_t> in_use;                   // page-rounded bytes per device
  int window_depth = 0;                         // open strict access windows, process-wide
};

// Leaked on purpose: allocators above us free memory from static destructors
// at exit, after a normal static registry would already be gone.
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    reg->in_use.assign(static_cast<size_t>(config().device_count), 0);
    return reg;
  }();
  return *r;
}

size_t pageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

bool roundUpToPage(size_t n, size_t* out) {
  size_t page = pageSize();
  if (n > SIZE_MAX - (page - 1)) return false;
  *out = (n + page - 1) / page * page;
  return true;
}

// The allocation whose [base, base + extent) contains p, where extent is the
// requested or the mapped size. Caller holds the registry lock.
const std::pair<const uintptr_t, Allocation>* findContaining(Registry& r, uintptr_t p, bool use_mapped) {
  auto it = r.allocations.upper_bound(p);
  if (it == r.allocations.begin()) return nullptr;
  --it;
  size_t extent = use_mapped ? it->second.mapped : it->second.size;
  if (p - it->first < extent) return &*it;
  return nullptr;
}

bool rangeInsideDeviceAllocation(Registry& r, uintptr_t p, size_t n, int* device_out) {
  const auto* a = findContaining(r, p, /*use_mapped=*/false);
  if (!a || !a->second.is_device()) return false;
  if (n > a->second.size - (p - a->first)) return false;
  if (device_out) *device_out = a->second.device;
  return true;
}

// Host ranges are checked against mapped extents: the rounding tail is device
// memory too (and faults in strict mode).
bool rangeTouchesDeviceMemory(Registry& r, uintptr_t p, size_t n) {
  uintptr_t end = p + n;
  // Allocations never overlap, so walking down from the last base below `end`
  // visits them in decreasing end order; stop once they end before p.
  auto it = r.allocations.lower_bound(end);
  while (it != r.allocations.begin()) {
    --it;
    if (it->first + it->second.mapped <= p) break;
    if (it->second.is_device()) return true;
  }
  return false;
}

void protectAllDeviceMemory(Registry& r, int prot) {
  for (const auto& [base, a] : r.allocations) {
    if (!a.is_device()) continue;
    if (mprotect(reinterpret_cast<void*>(base), a.mapped, prot) != 0) {
      static bool warned = false;  // under r.mu
      if (!warned) {
        warned = true;
        std::perror("mydev strict mode: mprotect failed; device memory protection is unreliable");
      }
    }
  }
}

}  // namespace

void initMemoryRegistry() { (void)registry(); }

mydevError_t validateRanges(std::initializer_list<RangeCheck> ranges) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const RangeCheck& c : ranges) {
    uintptr_t p = reinterpret_cast<uintptr_t>(c.ptr);
    if (c.device) {
      if (!rangeInsideDeviceAllocation(r, p, c.bytes, c.device_out)) return mydevErrorInvalidDevicePointer;
    } else {
      // A null or wrapping host range would fault in the copy itself.
      if (!c.ptr || p + c.bytes < p) return mydevErrorInvalidValue;
      if (rangeTouchesDeviceMemory(r, p, c.bytes)) return mydevErrorInvalidHostPointer;
    }
  }
  return mydevSuccess;
}

// Windows are process-wide rather than per thread because page protection is:
// while any runtime copy or launched function runs, all device memory is open.
// That loosens checking for other threads meanwhile, but never breaks a kernel.
AccessWindow::AccessWindow() {
  if (!config().strict) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.window_depth++ == 0) protectAllDeviceMemory(r, PROT_READ | PROT_WRITE);
}

AccessWindow::~AccessWindow() {
  if (!config().strict) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (--r.window_depth == 0) protectAllDeviceMemory(r, PROT_NONE);
}

bool findDeviceAllocationForSignal(uintptr_t addr, FaultAllocation* out) {
  // Blocking on the mutex in a signal handler could deadlock if this very
  // thread faulted while holding it, so try for a bounded time (the holder is
  // another thread doing a short registry update) and then give up. Both
  // try_lock (one atomic CAS) and nanosleep are safe in a handler in practice.
  Registry& r = registry();
  for (int attempt = 0; attempt < 1000; ++attempt) {
    if (r.mu.try_lock()) {
      const auto* a = findContaining(r, addr, /*use_mapped=*/true);
      bool found = a && a->second.is_device();
      if (found) *out = FaultAllocation{a->first, a->second.size, a->second.device};
      r.mu.unlock();
      return found;
    }
    struct timespec ts = {0, 1000000};  // 1 ms
    nanosleep(&ts, nullptr);
  }
  return false;
}

}  // namespace mydev_detail

using namespace mydev_detail;

namespace {

// Shared by device and pinned allocation; `device` is -1 for pinned memory.
mydevError_t allocate(void** ptr, size_t size, int device) {
  if (!ptr) return mydevErrorInvalidValue;
  *ptr = nullptr;
  if (size == 0) return mydevSuccess;
  size_t mapped;
  if (!roundUpToPage(size, &mapped)) return mydevErrorMemoryAllocation;

  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  int prot = PROT_READ | PROT_WRITE;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (device >= 0) {
    size_t used = r.in_use[static_cast<size_t>(device)];
    if (mapped > config().memory_limit - used) return mydevErrorMemoryAllocation;
    // Outside a window strict mode wants the pages sealed from birth; inside
    // one they join the open set and get sealed when it closes.
    if (config().strict && r.window_depth == 0) prot = PROT_NONE;
    // Capacity is enforced by our accounting; don't let the kernel's
    // overcommit heuristics refuse a large, mostly untouched device buffer.
    flags |= MAP_NORESERVE;
  }
  void* p = mmap(nullptr, mapped, prot, flags, -1, 0);
  if (p == MAP_FAILED) return mydevErrorMemoryAllocation;
  r.allocations.emplace(reinterpret_cast<uintptr_t>(p), Allocation{size, mapped, device});
  if (device >= 0) r.in_use[static_cast<size_t>(device)] += mapped;
  *ptr = p;
  return mydevSuccess;
}

mydevError_t release(void* ptr, bool device, mydevError_t not_found) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.allocations.end() || it->second.is_device() != device) return not_found;
  Allocation a = it->second;
  // Unregister before unmapping (both under the lock) so the fault handler
  // never attributes an address to an allocation that is already gone.
  r.allocations.erase(it);
  munmap(ptr, a.mapped);
  if (device) r.in_use[static_cast<size_t>(a.device)] -= a.mapped;
  return mydevSuccess;
}

}  // namespace

extern "C" {

mydevError_t mydevMalloc(void** ptr, size_t size) {
  if (mydevError_t e = ensureInitialized()) return e;
  return allocate(ptr, size, currentDevice());
}

mydevError_t mydevFree(void* ptr) {
  // In a poisoned fork child, destructors of inherited tensors still run;
  // letting them "succeed" keeps the child's shutdown quiet, and touching the
  // registry there could block on a lock held by a thread that no longer exists.
  if (inPoisonedChild()) return mydevSuccess;
  if (mydevError_t e = ensureInitialized()) return e;
  if (!ptr) return mydevSuccess;
  return release(ptr, /*device=*/true, mydevErrorInvalidDevicePointer);
}

mydevError_t mydevMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!free_bytes || !total_bytes) return mydevErrorInvalidValue;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  size_t limit = config().memory_limit;
  *total_bytes = limit;
  *free_bytes = limit - r.in_use[static_cast<size_t>(currentDevice())];
  return mydevSuccess;
}

mydevError_t mydevPointerGetAttributes(mydevPointerAttributes* attr, const void* ptr) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!attr) return mydevErrorInvalidValue;
  *attr = mydevPointerAttributes{mydevMemoryTypeUnregistered, -1, nullptr, 0};
  if (!ptr) return mydevSuccess;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (const auto* a = findContaining(r, reinterpret_cast<uintptr_t>(ptr), /*use_mapped=*/false)) {
    attr->type = a->second.is_device() ? mydevMemoryTypeDevice : mydevMemoryTypeHost;
    attr->device = a->second.device;
    attr->base = reinterpret_cast<void*>(a->first);
    attr->size = a->second.size;
  }
  return mydevSuccess;
}

mydevError_t mydevHostAlloc(void** ptr, size_t size) {
  if (mydevError_t e = ensureInitialized()) return e;
  return allocate(ptr, size, /*device=*/-1);
}

mydevError_t mydevFreeHost(void* ptr) {
  if (inPoisonedChild()) return mydevSuccess;  // see mydevFree
  if (mydevError_t e = ensureInitialized()) return e;
  if (!ptr) return mydevSuccess;
  return release(ptr, /*device=*/false, mydevErrorInvalidHostPointer);
}

}  // extern "C"
