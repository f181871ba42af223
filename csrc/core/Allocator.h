#pragma once
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <mydev_runtime.h>

namespace my_device {

using c10::CachingDeviceAllocator::DeviceStats;

// The device allocator: every mydev storage gets its bytes here. It is a
// c10::DeviceAllocator, so torch.accelerator's memory functions reach it.
c10::DeviceAllocator* device_allocator();
// True if `data_ptr` came from the device allocator (whatever its Device says).
bool is_device_data_ptr(const c10::DataPtr& data_ptr);
// For raw (pointer-only) frees: whether `ptr` is a live device allocation (at
// its device address), and freeing it.
bool is_device_pointer(void* ptr);
void free_device_pointer(void* ptr);
// Whether `data_ptr` is a live block of `device` allocated for `stream` (a
// null stream is the device's default stream): one a kernel queued on that
// stream may lease (KernelArgs.h).
bool allocated_for_stream(const c10::DataPtr& data_ptr, c10::DeviceIndex device, mydevStream_t stream);
// The device allocator's free clock: it ticks each time a block returns to a
// pool. A kernel that took its place in a stream at tick e (KernelContext)
// knows that blocks of its stream free since a tick <= e are leased by no
// kernel still to run (kernels launched later cannot lease a free block).
uint64_t free_clock(c10::DeviceIndex device);
// Device memory for CPU code running inside a kernel on `device` (the
// redirecting CPU allocator, HostKernel.cpp): a CPU-tagged DataPtr at the
// block's kernel address (see kernel_address) that frees the block when dropped.
c10::DataPtr allocate_for_kernel(c10::DeviceIndex device, size_t nbytes);
bool is_kernel_data_ptr(const c10::DataPtr& data_ptr);
// Such a DataPtr as the device's own: device address, mydev device.
c10::DataPtr to_device_data_ptr(c10::DataPtr&& kernel_data, c10::DeviceIndex device);
// Allocates on an explicit device (for its current stream) rather than the current device.
c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);

DeviceStats memory_stats(c10::DeviceIndex device);
void reset_peak_memory_stats(c10::DeviceIndex device);
void reset_accumulated_memory_stats(c10::DeviceIndex device);
// Returns every cached, unused segment of every device to the runtime, after
// waiting for the streams they belong to (kernels may still use leased blocks).
void empty_cache();
// Caps what the allocator may reserve on `device` at fraction * capacity.
void set_memory_fraction(double fraction, c10::DeviceIndex device);
// The block behind `data_ptr` is in use on `stream` too: it is not reused
// until work queued there so far has finished (Tensor.record_stream).
void record_stream(const c10::DataPtr& data_ptr, const c10::Stream& stream);

// Pinned (page-locked) host memory for fast and asynchronous transfers.
c10::Allocator* pinned_allocator();

} // namespace my_device
