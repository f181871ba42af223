// The allocator PyTorch sees for mydev (a c10::DeviceAllocator), device memory
// for kernels, memory events for the profiler, and the allocator's functions
// of Allocator.h, over the per-device caches of DeviceCache.h.
#include "Allocator.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <mydev_emulator.h>  // kernel addresses (allocate_for_kernel)

#include "DeviceCache.h"
#include "KernelDebugInfo.h"
#include "Launch.h"

namespace my_device {

namespace {

using namespace device_cache;

// Every allocation, free and kernel launch looks its device's cache up here:
// a table filled once (the device count never changes within a process), read
// inline with an acquire load; the first call per process, and an index out of
// range, go through make_caches.
std::array<std::atomic<DeviceCache*>, kMaxDevices> g_caches{};

C10_NOINLINE DeviceCache& make_caches(c10::DeviceIndex device) {
  static const bool made = [] {
    for (auto i : c10::irange(device_count())) {
      // Never destroyed: tensors that other static objects hold are freed
      // during static destruction, in no order this file controls.
      g_caches[static_cast<size_t>(i)].store(new DeviceCache(static_cast<c10::DeviceIndex>(i)),
                                             std::memory_order_release);
    }
    return true;
  }();
  (void)made;
  check_device_index(device);
  return *g_caches[static_cast<size_t>(device)].load(std::memory_order_acquire);
}

inline DeviceCache& cache_for(c10::DeviceIndex device) {
  if (C10_LIKELY(static_cast<size_t>(device) < kMaxDevices)) {
    if (DeviceCache* cache = g_caches[static_cast<size_t>(device)].load(std::memory_order_acquire)) return *cache;
  }
  return make_caches(device);
}

// torch.profiler(profile_memory=True): each allocation and free, with the
// device's totals after it. The profiler keeps its state per thread: a stream
// worker running a kernel reports under the state of the thread running the
// device profile (KernelDebugInfo.h).
void report_to_profiler(void* ptr, int64_t delta, c10::DeviceIndex device) {
  const DeviceStats stats = cache_for(device).stats();
  c10::reportMemoryUsageToProfiler(ptr, delta, static_cast<size_t>(stats.allocated_bytes[0].current),
                                   static_cast<size_t>(stats.reserved_bytes[0].current), c10::Device(kMyDev, device));
}

void report_memory(void* ptr, int64_t delta, c10::DeviceIndex device) {
  if (c10::memoryProfilingEnabled()) {
    report_to_profiler(ptr, delta, device);
    return;
  }
  if (!in_kernel()) return;
  auto state = profiler_state_for_kernels();
  if (state == nullptr) return;
  c10::DebugInfoGuard as_profiling_thread(std::move(state));
  if (c10::memoryProfilingEnabled()) report_to_profiler(ptr, delta, device);
}

// A freed DataPtr names its device through its deleter, one per device, so
// that a free takes only that device's lock. A raw free (raw_deleter, a
// kernel's scratch block) knows only the address and asks each device.
void free_on_device(c10::DeviceIndex device, void* ptr) {
  StackContext context = gather_free_context();  // before any lock: it may take the GIL
  const int64_t size = cache_for(device).free(ptr, context);
  TORCH_INTERNAL_ASSERT(size >= 0, "mydev allocator: freeing unknown pointer ", ptr, " on mydev:", device);
  report_memory(ptr, -size, device);
}

template <size_t D>
void free_on(void* ptr) {
  free_on_device(static_cast<c10::DeviceIndex>(D), ptr);
}

template <size_t... D>
constexpr std::array<c10::DeleterFnPtr, sizeof...(D)> free_fns(std::index_sequence<D...>) {
  return {&free_on<D>...};
}
constexpr std::array<c10::DeleterFnPtr, kMaxDevices> kFreeOn = free_fns(std::make_index_sequence<kMaxDevices>());

void free_block(void* ptr) {
  StackContext context = gather_free_context();
  for (auto i : c10::irange(device_count())) {
    const auto device = static_cast<c10::DeviceIndex>(i);
    const int64_t size = cache_for(device).free(ptr, context);
    if (size >= 0) {
      report_memory(ptr, -size, device);
      return;
    }
  }
  TORCH_INTERNAL_ASSERT(false, "mydev allocator: freeing unknown pointer ", ptr);
}

Block* live_block(void* ptr) {
  for (auto i : c10::irange(device_count())) {
    if (Block* block = cache_for(static_cast<c10::DeviceIndex>(i)).live_block(ptr)) return block;
  }
  return nullptr;
}

void free_kernel_block(void* kernel_ptr) {
  free_block(mydevDeviceAddress(kernel_ptr));
}

class CachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_on(current_device(), nbytes);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_block;
  }
  // Copy-on-write materialisation (c10::impl::cow, a write to a lazy clone)
  // calls this while it holds the shared storage's lock. A synchronous copy
  // would wait for the device there, and a queued kernel materialising another
  // clone of the same storage needs that lock: a deadlock. So the copy is
  // ordered like a kernel: in a kernel, whose stream has run everything before
  // it, at once; elsewhere queued on the current stream, behind work that may
  // still write the source.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count == 0) return;
    if (in_kernel()) {
      std::memcpy(kernel_address(dest), kernel_address(src), count);
      return;
    }
    mydevPointerAttributes attr{};
    MYDEV_CHECK(mydevPointerGetAttributes(&attr, dest));
    MYDEV_CHECK(mydevMemcpyAsync(dest, src, count, mydevMemcpyDeviceToDevice,
                                 current_stream_handle(static_cast<c10::DeviceIndex>(attr.device))));
  }
  bool initialized() override {
    return mydevIsInitialized() != 0;
  }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    empty_cache();
  }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    record_stream(ptr, stream);
  }
  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return memory_stats(device);
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    reset_accumulated_memory_stats(device);
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    reset_peak_memory_stats(device);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    RuntimeDeviceGuard on_device(device);
    size_t free_bytes = 0, total = 0;
    MYDEV_CHECK(mydevMemGetInfo(&free_bytes, &total));
    return {free_bytes, total};
  }
};

CachingAllocator g_device_allocator;


} // namespace

c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes) {
  const c10::Device where(kMyDev, device);
  if (nbytes == 0) {
    return {nullptr, where};
  }
  StackContext context = gather_alloc_context();  // before any lock: it may take the GIL
  Block* block = cache_for(device).allocate(nbytes, in_kernel() ? kScratch : current_stream_handle(device),
                                            std::move(context));
  // The block's size, as CUDA's allocator reports (and frees) it.
  report_memory(block->ptr, static_cast<int64_t>(block->size), device);
  return {block->ptr, block->ptr, kFreeOn[device], where};
}

c10::DataPtr allocate_for_kernel(c10::DeviceIndex device, size_t nbytes) {
  c10::DataPtr data = allocate_on(device, nbytes);
  void* ptr = data.release_context();  // owned by the DataPtr returned below
  if (ptr == nullptr) return {nullptr, c10::Device(c10::DeviceType::CPU)};
  void* at_kernel = mydevKernelAddress(ptr);
  return {at_kernel, at_kernel, &free_kernel_block, c10::Device(c10::DeviceType::CPU)};
}

bool is_kernel_data_ptr(const c10::DataPtr& data_ptr) {
  return data_ptr.get_deleter() == &free_kernel_block;
}

c10::DataPtr to_device_data_ptr(c10::DataPtr&& kernel_data, c10::DeviceIndex device) {
  TORCH_INTERNAL_ASSERT(is_kernel_data_ptr(kernel_data));
  void* ptr = mydevDeviceAddress(kernel_data.release_context());
  return {ptr, ptr, kFreeOn[device], c10::Device(kMyDev, device)};
}

c10::DeviceAllocator* device_allocator() {
  return &g_device_allocator;
}

bool is_device_data_ptr(const c10::DataPtr& data_ptr) {
  const c10::DeleterFnPtr deleter = data_ptr.get_deleter();
  return deleter == &free_block || std::find(kFreeOn.begin(), kFreeOn.end(), deleter) != kFreeOn.end();
}

uint64_t free_clock(c10::DeviceIndex device) {
  return cache_for(device).clock();
}

bool allocated_for_stream(const c10::DataPtr& data_ptr, c10::DeviceIndex device, mydevStream_t stream) {
  if (data_ptr.get_deleter() != kFreeOn[device] && data_ptr.get_deleter() != &free_block) return false;
  // A segment's blocks all belong to its stream (or pool), for as long as it exists.
  return cache_for(device).leasable(data_ptr.get(), stream);
}

c10::MempoolId_t new_pool_id(bool user_created) {
  static std::atomic<c10::CaptureId_t> next{1};
  const c10::CaptureId_t n = next.fetch_add(1);
  return user_created ? c10::MempoolId_t{n, 0} : c10::MempoolId_t{0, n};
}

void retain_pool(c10::DeviceIndex device, c10::MempoolId_t id) {
  cache_for(device).retain_pool(id);
}

void release_pool(c10::DeviceIndex device, c10::MempoolId_t id) {
  reap_finished_kernels();  // finished kernels may hold the last references to its tensors
  cache_for(device).release_pool(id);
}

int pool_use_count(c10::DeviceIndex device, c10::MempoolId_t id) {
  return cache_for(device).pool_use_count(id);
}

void begin_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t id, unsigned long long capture_id) {
  cache_for(device).begin_routing(id, capture_id);
}

void end_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t id) {
  cache_for(device).end_routing(id);
}

PoolCheckpoint checkpoint_pool(c10::DeviceIndex device, c10::MempoolId_t id) {
  return {device, id, cache_for(device).checkpoint_pool(id)};
}

PoolRestore restore_pool(const PoolCheckpoint& checkpoint) {
  return cache_for(checkpoint.device).restore_pool(checkpoint);
}

bool pool_allocations_are(c10::DeviceIndex device, c10::MempoolId_t id, const std::vector<void*>& ptrs) {
  return cache_for(device).pool_allocations_are(id, ptrs);
}

c10::DataPtr owning_data_ptr(c10::DeviceIndex device, void* ptr) {
  TORCH_CHECK(cache_for(device).live_block(ptr) != nullptr, "mydev allocator: ", ptr, " is no live block of mydev:",
              static_cast<int>(device));
  return {ptr, ptr, kFreeOn[device], c10::Device(kMyDev, device)};
}

bool is_device_pointer(void* ptr) {
  return live_block(ptr) != nullptr;
}

void free_device_pointer(void* ptr) {
  free_block(ptr);
}

DeviceStats memory_stats(c10::DeviceIndex device) {
  reap_finished_kernels();  // their tensors are garbage already; count them as freed
  return cache_for(device).stats();
}

void reset_peak_memory_stats(c10::DeviceIndex device) {
  cache_for(device).reset_peak();
}

void reset_accumulated_memory_stats(c10::DeviceIndex device) {
  cache_for(device).reset_accumulated();
}

void empty_cache() {
  reap_finished_kernels();
  for (auto i : c10::irange(device_count())) {
    cache_for(static_cast<c10::DeviceIndex>(i)).release_cached();
  }
}

void set_memory_fraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(fraction >= 0 && fraction <= 1, "invalid fraction: ", fraction, ". Please set within [0, 1].");
  cache_for(device).set_fraction(fraction);
}

std::vector<SegmentSnapshot> memory_snapshot() {
  reap_finished_kernels();  // their tensors are garbage already
  std::vector<SegmentSnapshot> out;
  for (auto i : c10::irange(device_count())) {
    cache_for(static_cast<c10::DeviceIndex>(i)).snapshot(out);
    if (recording_memory_history()) {
      record_trace({TraceEntry::Action::Snapshot, static_cast<c10::DeviceIndex>(i), 0, 0, 0, 0, 0, nullptr});
    }
  }
  return out;
}

void record_stream(const c10::DataPtr& data_ptr, const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kMyDev, "record_stream: expected a ", c10::DeviceTypeName(kMyDev, true),
              " stream, got a stream of device ", stream.device());
  if (data_ptr.get() == nullptr) return;
  Block* block = nullptr;
  for (auto i : c10::irange(device_count())) {
    if ((block = cache_for(static_cast<c10::DeviceIndex>(i)).live_block_containing(data_ptr.get()))) break;
  }
  TORCH_CHECK(block != nullptr, "record_stream: the tensor's memory does not come from the mydev allocator");
  cache_for(block->device).record_stream(block, stream_handle(stream));
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);

namespace {
void record_stream_kernel(at::Tensor& self, c10::Stream stream) {
  record_stream(self.storage().data_ptr(), stream);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("record_stream", TORCH_FN(record_stream_kernel));
}
} // namespace

} // namespace my_device
