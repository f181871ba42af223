#include "Allocator.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "Device.h"
#include "Exception.h"

namespace my_device {

namespace {

// A runtime allocation. Blocks are never split or merged yet: each lives in a
// per-size free list once its tensor dies, so a training loop that allocates
// the same shapes every step stops calling the runtime after the first step.
struct Block {
  void* ptr;
  size_t size;
  c10::DeviceIndex device;
};

// Small sizes round to 512 bytes, large ones to 2 MiB, bounding how many
// distinct free lists a workload creates and the waste per block.
size_t round_size(size_t n) {
  constexpr size_t kSmall = 512, kLarge = 2u << 20, kSmallLimit = 1u << 20;
  return n <= kSmallLimit ? (n + kSmall - 1) / kSmall * kSmall : (n + kLarge - 1) / kLarge * kLarge;
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::ostringstream os;
  os.precision(u == 0 ? 0 : 2);
  os << std::fixed << v << " " << units[u];
  return os.str();
}

class DeviceCache {
 public:
  Block* allocate(c10::DeviceIndex device, size_t nbytes) {
    const size_t size = round_size(nbytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        Block* block = it->second.back();
        it->second.pop_back();
        stats_.allocated += size;
        return block;
      }
    }
    RuntimeDeviceGuard on_device(device);
    void* ptr = nullptr;
    mydevError_t err = mydevMalloc(&ptr, size);
    if (err == mydevErrorMemoryAllocation) {
      release_cached();
      err = mydevMalloc(&ptr, size);
    }
    if (err == mydevErrorMemoryAllocation) {
      raise_oom(device, size);
    }
    MYDEV_CHECK(err);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocated += size;
    stats_.reserved += size;
    return new Block{ptr, size, device};
  }

  void free(Block* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocated -= block->size;
    free_[block->size].push_back(block);
  }

  void release_cached() {
    std::vector<Block*> blocks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& entry : free_) {
        blocks.insert(blocks.end(), entry.second.begin(), entry.second.end());
        for (Block* b : entry.second) stats_.reserved -= b->size;
      }
      free_.clear();
    }
    for (Block* b : blocks) {
      mydevFree(b->ptr);  // cannot fail for a live allocation; in a forked child it is a no-op
      delete b;
    }
  }

  DeviceMemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  [[noreturn]] void raise_oom(c10::DeviceIndex device, size_t size) {
    size_t free_bytes = 0, total = 0;
    mydevMemGetInfo(&free_bytes, &total);
    DeviceMemoryStats s = stats();
    TORCH_CHECK_WITH(OutOfMemoryError, false, "mydev out of memory. Tried to allocate ",
        format_bytes(size), ". mydev:", static_cast<int>(device), " has a total capacity of ",
        format_bytes(total), " of which ", format_bytes(free_bytes), " is free. Of the allocated memory ",
        format_bytes(s.allocated), " is allocated by PyTorch, and ",
        format_bytes(s.reserved - s.allocated), " is reserved by PyTorch but unallocated. "
        "(MYDEV_MEMORY_LIMIT sets the capacity.)");
  }

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<Block*>> free_;
  DeviceMemoryStats stats_;
};

DeviceCache& cache_for(c10::DeviceIndex device) {
  // Sized once: device count never changes within a process.
  static std::vector<std::unique_ptr<DeviceCache>> caches = [] {
    std::vector<std::unique_ptr<DeviceCache>> v;
    for (auto i : c10::irange(device_count())) {
      (void)i;
      v.emplace_back(std::make_unique<DeviceCache>());
    }
    return v;
  }();
  check_device_index(device);
  return *caches[device];
}

// Device DataPtrs are "simple" (context == pointer) because CPU libraries that
// host kernels call, oneDNN among them, allocate through the CPU allocator's
// raw_allocate/raw_deleter, which require it. The block is found by address.
std::mutex g_live_mutex;
std::unordered_map<void*, Block*> g_live;

void free_block(void* ptr) {
  Block* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    auto it = g_live.find(ptr);
    TORCH_INTERNAL_ASSERT(it != g_live.end(), "mydev allocator: freeing unknown pointer ", ptr);
    block = it->second;
    g_live.erase(it);
  }
  cache_for(block->device).free(block);
}

class DeviceAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_on(current_device(), nbytes);
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_block;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    MYDEV_CHECK(mydevMemcpy(dest, src, count, mydevMemcpyDeviceToDevice));
  }
};

DeviceAllocator g_device_allocator;

void free_pinned(void* ptr) {
  mydevFreeHost(ptr);
}

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes > 0) {
      MYDEV_CHECK(mydevHostAlloc(&ptr, nbytes));
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedAllocator g_pinned_allocator;

} // namespace

c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes) {
  const c10::Device where(kMyDev, device);
  if (nbytes == 0) {
    return {nullptr, where};
  }
  Block* block = cache_for(device).allocate(device, nbytes);
  {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    g_live.emplace(block->ptr, block);
  }
  return {block->ptr, block->ptr, &free_block, where};
}

c10::Allocator* device_allocator() {
  return &g_device_allocator;
}

bool is_device_data_ptr(const c10::DataPtr& data_ptr) {
  return data_ptr.get_deleter() == &free_block;
}

bool is_device_pointer(void* ptr) {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  return g_live.count(ptr) != 0;
}

void free_device_pointer(void* ptr) {
  free_block(ptr);
}

DeviceMemoryStats memory_stats(c10::DeviceIndex device) {
  return cache_for(device).stats();
}

void empty_cache() {
  for (auto i : c10::irange(device_count())) {
    cache_for(i).release_cached();
  }
}

c10::Allocator* pinned_allocator() {
  return &g_pinned_allocator;
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);

} // namespace my_device
