#pragma once
// What a queued kernel keeps of its tensor arguments.
//
// A GPU kernel does not keep its tensors alive. When the host drops a tensor
// whose kernel is still queued, the caching allocator takes the block back at
// once and hands it to the next allocation on the same stream: every kernel
// that can receive it is queued behind the ones still using it. A kernel that
// held references instead would keep every tensor the host dropped while it
// waited, and a host running far ahead (a loop of 4 MB ops with no sync)
// would reserve memory for all of them.
//
// So a kernel *leases* a storage whose block was allocated for the stream it
// is launched on: it gets a StorageImpl over the same bytes that does not own
// them, and the caller's storage frees the block as usual. The allocator never
// returns a cached block to the runtime while its stream has work queued
// (Allocator.cpp), so a lease stays valid until its kernel has run.
//
// A storage that owns no memory (a graph replay's output) is leased too: its
// memory's owner keeps it valid, as CUDA's kernels assume.
//
// Other storages are held by reference, as before:
//  - blocks of another stream or device: CUDA lets the allocation stream reuse
//    them at once unless the user called record_stream; holding them is the
//    safe version of that rule;
//  - pinned host memory, which has no stream;
//  - blocks under kLeaseMinBytes: a lease costs two small heap allocations,
//    more than such a block is worth holding back for a while (except while a
//    graph is captured: its kernels last as long as the graph).
//
// One KernelArgs per launch: every argument over the same storage gets the
// same leased StorageImpl, so CPU kernels' alias and overlap checks, which
// compare StorageImpls, see what they would see on the caller's tensors.
#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <utility>

#include "Device.h"
#include "Stream.h"

namespace my_device {

// How a kernel uses a tensor it is given, for the graph replays that run
// kernels side by side (captured_memory): a kernel that may write it, or one
// that only reads it. Unsure is kWrites.
enum class Touch { kReads, kWrites };

class KernelArgs {
 public:
  // Leases are only taken for blocks of `device`'s current stream, where the
  // kernel is about to be launched.
  explicit KernelArgs(c10::DeviceIndex device);

  c10::DeviceIndex device() const {
    return device_;
  }
  // `t` under a TensorImpl of its own (see kernel_handle), over a leased
  // storage when it can be leased. A CPU tensor (a 0-dim scalar argument) is
  // copied, to be read as it is at the launch; wrapped numbers are returned
  // as they are.
  at::Tensor own(const at::Tensor& t, Touch touch = Touch::kWrites);
  // `t` itself unless its storage can be leased, then as own(): for jobs that
  // need no TensorImpl of their own (a TensorIterator records its operands'
  // geometry and data pointers when it is built). A storage shared this way is
  // also held here, since the caller may swap it out of `t` (set_, .data =)
  // before the kernel ran: such a job keeps its KernelArgs until then.
  at::Tensor share(const at::Tensor& t, Touch touch = Touch::kWrites);
  // Points the job's own TensorImpl `t` at a lease of its storage, if it can
  // be leased: for an output the job created and shares with the caller
  // through another TensorImpl.
  void lease_in_place(const at::Tensor& t);
  // What a kernel that only needs the bytes must hold of `s`: `s` itself, or
  // nothing when the block can be leased (a lease needs no object to hold).
  c10::Storage keep(const c10::Storage& s, Touch touch = Touch::kWrites);
  // Records `s` as the kernel touches it, for a storage kept once for several
  // tensors (HostOperands).
  void touch(const c10::Storage& s, Touch touch);

  // Smallest storage that is leased rather than held.
  static constexpr size_t kLeaseMinBytes = 64 * 1024;

  // While a graph is being captured: the device memory of every storage that
  // passed through this KernelArgs, which is all the kernel touches when the
  // job reaches its tensors through it only (the launch declares it to the
  // capture: launch_async). Null when not capturing, or when a tensor passed
  // through has device memory beyond a strided storage's (a sparse tensor).
  struct MemoryRange {
    const void* ptr;
    size_t bytes;
    bool written;
  };
  const c10::SmallVector<MemoryRange, 4>* captured_memory() const {
    return recording_ && !incomplete_ ? &memory_ : nullptr;
  }

 private:
  void record(const at::Tensor& t, Touch touch);
  void record(const c10::StorageImpl* s, Touch touch);
  const c10::Storage* lease(const c10::Storage& s);

  c10::DeviceIndex device_;
  mydevStream_t stream_;
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 3> leases_;
  c10::SmallVector<c10::Storage, 3> shared_;
  bool recording_;
  bool incomplete_ = false;
  c10::SmallVector<MemoryRange, 4> memory_;
};

} // namespace my_device
