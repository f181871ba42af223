#pragma once
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <mydev_runtime.h>

#include <vector>

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

// Private pools, named by c10::MempoolId_t as CUDA's: a graph's (its
// captured work's memory, kept for its replays) and torch.mydev.MemPool's.
// A pool's blocks serve only allocations routed to it, and go back to the
// runtime only once the pool is released (freed blocks then at once,
// allocated ones when they are freed).
// A new id: {n, 0} for one a user asked for (graph_pool_handle, MemPool),
// {0, n} for one a graph makes itself.
c10::MempoolId_t new_pool_id(bool user_created);
// Creates the pool on `device`, or takes one more use of it.
void retain_pool(c10::DeviceIndex device, c10::MempoolId_t id);
// Drops one use; at none the pool is released. Only once no work that may
// still use its memory is queued (a graph's replays have finished).
void release_pool(c10::DeviceIndex device, c10::MempoolId_t id);
int pool_use_count(c10::DeviceIndex device, c10::MempoolId_t id);
// While active, allocations on `device` go to pool `id`: those for streams
// taking part in runtime capture `capture_id`, or, with capture_id 0, those
// the calling thread makes (torch.mydev.use_mem_pool). During a capture only
// the pool's own blocks may be leased by captured kernels (allocated_for_stream):
// the replays use them in the order the capture did, and nothing else can.
void begin_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t id, unsigned long long capture_id);
void end_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t id);

// Checkpoints of a private pool, for Inductor's cudagraph trees
// (my_device/inductor/graph_trees.py). After a graph's replays the pool's
// blocks no longer say which tensors are alive: a replay's outputs are tensors
// that do not own their memory. Before recording another graph into the pool,
// the trees restore the layout checkpointed when the graph was recorded.
struct PoolCheckpoint {
  struct Block {
    size_t size;
    size_t requested;
    bool allocated;
  };
  struct Segment {
    void* base;
    std::vector<Block> blocks;  // in address order, covering the segment
  };
  c10::DeviceIndex device;
  c10::MempoolId_t id;
  std::vector<Segment> segments;
};
PoolCheckpoint checkpoint_pool(c10::DeviceIndex device, c10::MempoolId_t id);
// Restoring frees every block of the pool allocated now (`freed`) and
// allocates again, at their addresses, those allocated at the checkpoint
// (`allocated`): the caller hands those to the tensors still alive (owning_data_ptr)
// and frees the others.
struct PoolRestore {
  std::vector<void*> freed;
  std::vector<void*> allocated;
};
PoolRestore restore_pool(const PoolCheckpoint& checkpoint);
// Whether the live blocks of pool `id` are exactly those at `ptrs`.
bool pool_allocations_are(c10::DeviceIndex device, c10::MempoolId_t id, const std::vector<void*>& ptrs);
// A DataPtr that owns the live block at `ptr` of `device`: dropping it frees the block.
c10::DataPtr owning_data_ptr(c10::DeviceIndex device, void* ptr);

// Pinned (page-locked) host memory for fast and asynchronous transfers.
c10::Allocator* pinned_allocator();

} // namespace my_device
