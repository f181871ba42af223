// Device and pinned host memory: the allocation registry, per-device capacity
// accounting, and strict mode's two addresses for device memory.
//
// Every allocation is its own mmap. That keeps device memory apart from the
// host heap (so a stray host pointer never aliases it) and commits nothing up
// front: the limit is a number we account against, not memory we reserve.
//
// Outside strict mode (and for pinned memory always) an allocation is one
// private anonymous mapping, and its kernel address is its device address.
//
// In strict mode (MYDEV_STRICT=1) a device allocation is a memfd mapped twice,
// MAP_SHARED: the device view, whose address mydevMalloc returns and every
// runtime call takes, is PROT_NONE for the allocation's whole life, so any
// dereference of a device address faults (strict_fault.cpp reports it); the
// kernel view is PROT_READ|PROT_WRITE and reaches the same bytes for launched
// functions (through mydevKernelAddress) and for the runtime's own copies and
// memsets (translated when they are validated). Nothing is ever mprotected,
// so protection no longer depends on what other threads are running: page
// protection is per process, and without protection keys two views are the
// only way to let kernels in while keeping the host out. Both views are
// MADV_DONTFORK: a forked child (poisoned anyway) inherits neither, so it can
// neither see nor change the parent's live memory through the shared mapping.
// The memfd is closed right after mapping; the mappings keep its pages alive,
// and unmapping both in mydevFree returns them. memfd pages are committed
// (and charged) only when touched, like MAP_NORESERVE anonymous memory.
// Each view extends at least one byte past the requested size (a whole-page
// allocation gets one more page of address space, never accounted or
// touched), so the address one past an allocation's end always belongs to
// that view and never starts another mapping: translating end pointers is
// unambiguous, and a device address is never also a kernel address.
#include "internal.h"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <vector>

namespace mydev_detail {
namespace {

struct Allocation {
  size_t size;    // as requested; bounds what copies may touch
  size_t mapped;  // page-rounded; what is accounted against the device
  // Bytes mapped (per view): `mapped`, or in strict mode `mapped` plus a page
  // if that leaves no byte past `size` (see the top of the file).
  size_t span;
  int device;     // -1 for pinned host memory
  // Base of the kernel view: the key itself outside strict mode and for
  // pinned memory, the second mapping of a strict-mode device allocation.
  uintptr_t kernel;
  bool is_device() const { return device >= 0; }
};

// A strict-mode kernel view, for translating kernel addresses back.
struct KernelView {
  uintptr_t device_base;
  size_t size;
};

// A freed strict-mode device allocation whose two views are kept reserved
// (PROT_NONE, no pages) for a while: until then no later mapping can take its
// addresses, so code still using them faults, and the fault handler can say
// what they were, instead of a plain SIGSEGV or, once reused, silent corruption.
struct Freed {
  uintptr_t device_base;
  uintptr_t kernel_base;
  size_t span;
  size_t size;
  int device;
};
// How many freed allocations stay reserved. Each costs two mappings of address
// space and no memory (vm.max_map_count, about 65k, bounds live plus reserved).
constexpr size_t kQuarantined = 256;

struct Registry {
  std::mutex mu;
  std::deque<Freed> quarantine;  // oldest first
  std::map<uintptr_t, Allocation> allocations;  // keyed by (device) base address
  // Strict mode only: the kernel views of device allocations, keyed by kernel
  // base. Not allocations: a kernel address is host memory to the registry.
  std::map<uintptr_t, KernelView> kernel_views;
  std::vector<size_t> in_use;                   // page-rounded bytes per device
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
// requested or the mapped size (its span). Caller holds the registry lock.
const std::pair<const uintptr_t, Allocation>* findContaining(Registry& r, uintptr_t p, bool use_mapped) {
  auto it = r.allocations.upper_bound(p);
  if (it == r.allocations.begin()) return nullptr;
  --it;
  size_t extent = use_mapped ? it->second.span : it->second.size;
  if (p - it->first < extent) return &*it;
  return nullptr;
}

bool rangeInsideDeviceAllocation(Registry& r, uintptr_t p, size_t n, int* device_out, void** kernel_out) {
  const auto* a = findContaining(r, p, /*use_mapped=*/false);
  if (!a || !a->second.is_device()) return false;
  if (n > a->second.size - (p - a->first)) return false;
  if (device_out) *device_out = a->second.device;
  if (kernel_out) *kernel_out = reinterpret_cast<void*>(a->second.kernel + (p - a->first));
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
    if (it->first + it->second.span <= p) break;
    if (it->second.is_device()) return true;
  }
  return false;
}

// For address translation: the entry of `m` (keyed by base) whose
// [base, base + size] holds p, the end included. Unambiguous in strict mode,
// where every view's span reaches past base + size. Caller holds the
// registry lock.
template <class Map, class SizeOf>
const typename Map::value_type* findForTranslation(const Map& m, uintptr_t p, SizeOf size_of) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  if (p - it->first <= size_of(it->second)) return &*it;
  return nullptr;
}

}  // namespace

void initMemoryRegistry() { (void)registry(); }

mydevError_t validateRanges(std::initializer_list<RangeCheck> ranges) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const RangeCheck& c : ranges) {
    uintptr_t p = reinterpret_cast<uintptr_t>(c.ptr);
    if (c.device) {
      if (!rangeInsideDeviceAllocation(r, p, c.bytes, c.device_out, c.kernel_out)) {
        return mydevErrorInvalidDevicePointer;
      }
    } else {
      // Kernel views are not in `allocations`, so a host range in one (a
      // launched function passing its kernel address as the host side) is
      // accepted as the host memory it is.
      // A null or wrapping host range would fault in the copy itself.
      if (!c.ptr || p + c.bytes < p) return mydevErrorInvalidValue;
      if (rangeTouchesDeviceMemory(r, p, c.bytes)) return mydevErrorInvalidHostPointer;
    }
  }
  return mydevSuccess;
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
      for (auto it = r.quarantine.rbegin(); !found && it != r.quarantine.rend(); ++it) {
        const bool device_view = addr - it->device_base < it->span;
        if (device_view || addr - it->kernel_base < it->span) {
          *out = FaultAllocation{it->device_base, it->size, it->device, /*freed=*/true, !device_view};
          found = true;
        }
      }
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

// Strict mode's two views of one device allocation (see the top of the file).
// Caller holds the registry lock (nothing else may see a half-made pair).
bool mapStrictViews(size_t span, void** device_view, void** kernel_view) {
  int fd = memfd_create("mydev", MFD_CLOEXEC);
  if (fd < 0) return false;
  void* dev = MAP_FAILED;
  void* ker = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(span)) == 0) {
    // MAP_NORESERVE as for anonymous device memory (a memfd is charged per
    // touched page anyway); capacity is enforced by our accounting.
    dev = mmap(nullptr, span, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    ker = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  }
  close(fd);  // the mappings keep the memory
  if (dev == MAP_FAILED || ker == MAP_FAILED ||
      madvise(dev, span, MADV_DONTFORK) != 0 || madvise(ker, span, MADV_DONTFORK) != 0) {
    if (dev != MAP_FAILED) munmap(dev, span);
    if (ker != MAP_FAILED) munmap(ker, span);
    return false;
  }
  *device_view = dev;
  *kernel_view = ker;
  return true;
}

// Shared by device and pinned allocation; `device` is -1 for pinned memory.
mydevError_t allocate(void** ptr, size_t size, int device) {
  if (!ptr) return mydevErrorInvalidValue;
  *ptr = nullptr;
  if (size == 0) return mydevSuccess;
  size_t mapped;
  if (!roundUpToPage(size, &mapped)) return mydevErrorMemoryAllocation;

  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  void* p = nullptr;
  void* kernel = nullptr;
  size_t span = mapped;
  if (device >= 0) {
    size_t used = r.in_use[static_cast<size_t>(device)];
    if (mapped > config().memory_limit - used) return mydevErrorMemoryAllocation;
  }
  if (device >= 0 && config().strict) {
    if (size == mapped) span += pageSize();  // no overflow: mapped <= the limit
    if (!mapStrictViews(span, &p, &kernel)) return mydevErrorMemoryAllocation;
    r.kernel_views.emplace(reinterpret_cast<uintptr_t>(kernel),
                           KernelView{reinterpret_cast<uintptr_t>(p), size});
  } else {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
    // Capacity is enforced by our accounting; don't let the kernel's
    // overcommit heuristics refuse a large, mostly untouched device buffer.
    if (device >= 0) flags |= MAP_NORESERVE;
    p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) return mydevErrorMemoryAllocation;
    kernel = p;
  }
  r.allocations.emplace(reinterpret_cast<uintptr_t>(p),
                        Allocation{size, mapped, span, device, reinterpret_cast<uintptr_t>(kernel)});
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
  if (a.kernel == reinterpret_cast<uintptr_t>(ptr)) {
    munmap(ptr, a.span);
  } else {  // strict mode's two views: reserved for a while (see Freed)
    r.kernel_views.erase(a.kernel);
    void* views[2] = {ptr, reinterpret_cast<void*>(a.kernel)};
    bool reserved = true;
    for (void* v : views) {
      // Replacing the mapping drops the memfd's pages; the range stays ours.
      const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED;
      reserved = mmap(v, a.span, PROT_NONE, flags, -1, 0) != MAP_FAILED && reserved;
    }
    if (reserved) {
      r.quarantine.push_back(Freed{reinterpret_cast<uintptr_t>(ptr), a.kernel, a.span, a.size, a.device});
    } else {
      for (void* v : views) munmap(v, a.span);
    }
    if (r.quarantine.size() > kQuarantined) {
      const Freed& oldest = r.quarantine.front();
      munmap(reinterpret_cast<void*>(oldest.device_base), oldest.span);
      munmap(reinterpret_cast<void*>(oldest.kernel_base), oldest.span);
      r.quarantine.pop_front();
    }
  }
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

// Both translations cost one branch outside strict mode. In strict mode they
// take the registry lock for a map lookup; they never initialise the runtime
// (before initialisation there is nothing to translate) and, in a poisoned
// fork child, return their argument (the child has neither view).
void* mydevKernelAddress(const void* ptr) {
  void* p = const_cast<void*>(ptr);
  if (!config().strict) return p;
  if (!p || !mydevIsInitialized() || inPoisonedChild()) return p;
  uintptr_t u = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto* a = findForTranslation(r.allocations, u, [](const Allocation& x) { return x.size; });
  if (!a || !a->second.is_device()) return p;
  return reinterpret_cast<void*>(a->second.kernel + (u - a->first));
}

void* mydevDeviceAddress(const void* ptr) {
  void* p = const_cast<void*>(ptr);
  if (!config().strict) return p;
  if (!p || !mydevIsInitialized() || inPoisonedChild()) return p;
  uintptr_t u = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto* v = findForTranslation(r.kernel_views, u, [](const KernelView& x) { return x.size; });
  if (!v) return p;
  return reinterpret_cast<void*>(v->second.device_base + (u - v->first));
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
