// Pinned (page-locked) host memory, the host side of fast and asynchronous
// copies: torch's pin_memory(), DataLoader(pin_memory=True) and
// torch.accelerator's host-memory functions reach it as the PrivateUse1
// at::HostAllocator. The runtime owns the memory (mydevHostAlloc); a port
// replaces those two calls with its driver's.
#include <ATen/core/CachingHostAllocator.h>

#include <mydev_runtime.h>

#include "Allocator.h"
#include "Exception.h"

namespace my_device {
namespace {

void free_pinned(void* ptr) {
  mydevFreeHost(ptr);
}

// A HostAllocator, so that torch.accelerator's host-memory functions reach it
// (at::accelerator::emptyHostCache calls the registered one unchecked). It
// keeps no cache: each block comes from and returns to the runtime.
class PinnedAllocator final : public at::HostAllocator {
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
  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override {
    return true;  // copies from pinned memory hold the memory themselves (KernelArgs.h)
  }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    return {};
  }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

PinnedAllocator g_pinned_allocator;

} // namespace

c10::Allocator* pinned_allocator() {
  return &g_pinned_allocator;
}

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_pinned_allocator);

} // namespace my_device
