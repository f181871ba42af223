#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

namespace my_device {

struct DeviceMemoryStats {
  size_t allocated = 0;  // bytes handed out to tensors, by rounded block size
  size_t reserved = 0;   // bytes obtained from the runtime (allocated + cached)
};

// The device allocator: every mydev storage gets its bytes here.
c10::Allocator* device_allocator();
// True if `data_ptr` came from device_allocator() (whatever its Device says).
bool is_device_data_ptr(const c10::DataPtr& data_ptr);
// Allocates on an explicit device rather than the current one.
// For raw (pointer-only) frees: whether `ptr` is a live device allocation, and freeing it.
bool is_device_pointer(void* ptr);
void free_device_pointer(void* ptr);
c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);
DeviceMemoryStats memory_stats(c10::DeviceIndex device);
// Returns every cached, unused block of every device to the runtime.
void empty_cache();

// Pinned (page-locked) host memory for fast and asynchronous transfers.
c10::Allocator* pinned_allocator();

} // namespace my_device
