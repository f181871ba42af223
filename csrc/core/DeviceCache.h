#pragma once
// The device cache: per device, the caching allocator's segments, blocks,
// pools and statistics. Allocator.cpp is the allocator PyTorch sees, on top.
//
// Modelled on CUDA's: memory comes from the runtime in segments, is split into
// blocks, and freed blocks stay cached per (device, stream) so later
// allocations reuse them without a runtime call. Freed neighbours merge back;
// empty_cache returns whole free segments.
//
// A freed block is reusable at once by its own stream, even while kernels
// queued there still use it (they lease it, KernelArgs.h): whatever reuses it
// is queued behind them. What must wait is giving memory back to the runtime:
// a segment is released only once its stream has no queued work, as CUDA's
// cudaFree waits for the device.
//
// Kernels allocate too: a host kernel's CPU code takes its outputs and scratch
// memory through the CPU allocator (HostKernel.cpp). That happens out of
// stream order: a queued kernel runs after the host has moved on, and an
// inline one while other host threads may queue work on its stream. Blocks of
// the stream's pool may then still be leased by this very kernel or by kernels
// queued behind it, so kernels are served from a pool of their own (kScratch).
// A scratch block is never leased, so once freed nothing uses it and any
// kernel may take it.
#include "Allocator.h"

#include "Launch.h"
#include "MemoryHistory.h"
#include "MemorySnapshot.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <atomic>
#include <mutex>
#include <map>
#include <set>
#include <thread>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "Device.h"
#include "Event.h"
#include "Exception.h"
#include "Stream.h"
#include "KernelDebugInfo.h"

namespace my_device {
namespace device_cache {


using c10::CachingAllocator::StatType;

constexpr size_t kMinBlock = 512;            // every block is a multiple of this
constexpr size_t kSmallSize = 1u << 20;      // requests up to 1 MiB use the small pool...
constexpr size_t kSmallSegment = 2u << 20;   // ...carved from 2 MiB segments
constexpr size_t kLargeRound = 2u << 20;     // large segments are whole multiples of 2 MiB

// The pool key of allocations made inside kernels (see above): not a stream,
// and never passed to the runtime.
const mydevStream_t kScratch = reinterpret_cast<mydevStream_t>(static_cast<uintptr_t>(1));
// The pool keys of private pools (Allocator.h): numbers no stream handle (an
// aligned pointer) or kScratch can be, never passed to the runtime either.
inline bool is_pool_key(mydevStream_t key) {
  return (reinterpret_cast<uintptr_t>(key) & 3u) == 2u;
}
inline mydevStream_t new_pool_key() {
  static std::atomic<uintptr_t> next{1};
  return reinterpret_cast<mydevStream_t>((next.fetch_add(1) << 2) | 2u);
}

struct Block {
  c10::DeviceIndex device;
  mydevStream_t stream;  // the stream it was allocated for: it is reused only there
  size_t size;
  void* ptr;
  bool small;
  bool allocated = false;
  size_t requested = 0;
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
  std::vector<mydevStream_t> used_on;  // other streams (record_stream)
  uint64_t freed_at = 0;  // free_clock when it last returned to its pool
  bool awaiting_free = false;  // freed, waiting for work queued on other streams (used_on)
  StackContext context;        // the stack that allocated it, while memory history is recorded
};

inline uintptr_t stream_key(mydevStream_t stream) {
  return is_default_stream_handle(stream) ? 0 : reinterpret_cast<uintptr_t>(stream);
}

inline C10_NOINLINE void record(TraceEntry::Action action, c10::DeviceIndex device, const void* addr, size_t size,
                         mydevStream_t stream, StackContext context, size_t device_free) {
  record_trace({action, device, reinterpret_cast<uintptr_t>(addr), size, stream_key(stream), device_free, 0,
                std::move(context)});
}

// Every allocation and free passes here three times: the check is inlined.
inline void trace(TraceEntry::Action action, c10::DeviceIndex device, const void* addr, size_t size,
                  mydevStream_t stream, StackContext context = nullptr, size_t device_free = 0) {
  if (C10_UNLIKELY(recording_memory_history())) record(action, device, addr, size, stream, std::move(context), device_free);
}

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};
using Pool = std::set<Block*, BlockOrder>;

inline size_t round_size(size_t n) {
  return n < kMinBlock ? kMinBlock : (n + kMinBlock - 1) / kMinBlock * kMinBlock;
}

inline std::string format_bytes(size_t bytes) {
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

// Every allocation and free updates ten of these: inlined, and the pool's
// index computed rather than looked up through a list.
C10_ALWAYS_INLINE void update(c10::CachingAllocator::StatArray& stat, bool small, int64_t delta) {
  auto& all = stat[static_cast<size_t>(StatType::AGGREGATE)];
  auto& pool = stat[static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL)];
  if (delta >= 0) {
    all.increase(static_cast<size_t>(delta));
    pool.increase(static_cast<size_t>(delta));
  } else {
    all.decrease(static_cast<size_t>(-delta));
    pool.decrease(static_cast<size_t>(-delta));
  }
}

class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device) : device_(device) {}

  Block* allocate(size_t nbytes, mydevStream_t stream, StackContext context) {
    const size_t size = round_size(nbytes);
    const bool small = size <= kSmallSize;
    std::unique_lock<std::mutex> lock(mutex_);
    if (C10_UNLIKELY(!routes_.empty()) && stream != kScratch) stream = route(stream, /*leases_only=*/false);
    if (!pending_.empty()) process_events();
    Block* block = take_binned(stream, size);
    if (block == nullptr) block = carve(size, small, stream, nbytes, context, lock);
    trace(TraceEntry::Action::Alloc, device_, block->ptr, block->size, stream, context);
    take(block, nbytes, std::move(context));
    return block;
  }

  // Marks a block allocated (for `nbytes` bytes), with the statistics.
  void take(Block* block, size_t nbytes, StackContext context) {
    live_.emplace(block->ptr, block);
    block->allocated = true;
    block->requested = nbytes;
    block->context = std::move(context);
    const bool small = block->small;
    update(stats_.allocation, small, 1);
    update(stats_.allocated_bytes, small, static_cast<int64_t>(block->size));
    update(stats_.active, small, 1);
    update(stats_.active_bytes, small, static_cast<int64_t>(block->size));
    update(stats_.requested_bytes, small, static_cast<int64_t>(nbytes));
  }

  // A block of `size` bytes from the pool, split off a free block of the
  // stream or a new segment.
  Block* carve(size_t size, bool small, mydevStream_t stream, size_t nbytes, const StackContext& context,
               std::unique_lock<std::mutex>& lock) {
    Pool& pool = small ? small_ : large_;
    Block* block = nullptr;
    Block key{device_, stream, size, nullptr, small};
    auto it = pool.lower_bound(&key);
    if ((it == pool.end() || (*it)->stream != stream) && binned_ > 0) {
      flush_bins();  // the bins' blocks, merged, may serve it
      it = pool.lower_bound(&key);
    }
    if (it != pool.end() && (*it)->stream == stream) {
      block = *it;
      pool.erase(it);
    } else {
      block = new_segment(small ? kSmallSegment : (size + kLargeRound - 1) / kLargeRound * kLargeRound, small,
                          stream, nbytes, lock);
      segments_.insert(block);
      trace(TraceEntry::Action::SegmentAlloc, device_, block->ptr, block->size, stream, context);
    }
    const size_t remaining = block->size - size;
    if (remaining >= (small ? kMinBlock : kSmallSize + 1)) pool.insert(split(block, size));
    return block;
  }

  // Cuts free `block` (out of its pool) after its first `size` bytes; returns
  // the second part, also free and out of the pool.
  static Block* split(Block* block, size_t size) {
    auto* rest = new Block{block->device, block->stream, block->size - size, static_cast<char*>(block->ptr) + size,
                           block->small};
    rest->freed_at = block->freed_at;
    rest->prev = block;
    rest->next = block->next;
    if (block->next) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    return rest;
  }

  // Frees the live block at `ptr`, if this device has one, and returns its
  // size (-1 if it has none).
  int64_t free(void* ptr, StackContext& context) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return -1;
    Block* block = it->second;
    live_.erase(it);
    const auto size = static_cast<int64_t>(block->size);
    free_locked(block, std::move(context), lock);  // `block` may be merged away
    return size;
  }

  Block* live_block(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    return it == live_.end() ? nullptr : it->second;
  }

  // The live block whose bytes include `ptr`: a storage imported through DLPack
  // (core/DLPack.cpp) starts where the exported view started, inside the block
  // of the producer's storage. A scan, for that rare case only.
  Block* live_block_containing(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it != live_.end()) return it->second;
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    for (const auto& [start, block] : live_) {
      const auto begin = reinterpret_cast<uintptr_t>(start);
      if (address >= begin && address < begin + block->size) return block;
    }
    return nullptr;
  }

  void free_locked(Block* block, StackContext context, std::unique_lock<std::mutex>& lock) {
    trace(TraceEntry::Action::FreeRequested, device_, block->ptr, block->size, block->stream, std::move(context));
    count_free(block);
    if (!block->used_on.empty()) {
      // Still in use by work queued on other streams: reuse only after it ran.
      // The events are recorded with the lock released: a record on a full
      // stream waits for room, which its worker may only make after taking
      // this lock (a kernel allocating scratch memory).
      std::vector<mydevStream_t> streams;
      streams.swap(block->used_on);
      block->awaiting_free = true;
      lock.unlock();
      std::vector<Event> events;
      for (mydevStream_t s : streams) {
        std::optional<Event> e = Event::try_create();
        if (e && e->record(s) == mydevSuccess) events.push_back(std::move(*e));
      }
      lock.lock();
      pending_.push_back({block, std::move(events)});
      return;
    }
    const mydevStream_t key = block->stream;
    release_block(block);
    if (C10_UNLIKELY(is_pool_key(key)) && pool_released(key)) release_pool_segments(key);
  }

  // The statistics of a free; active ones follow when the block is reusable (release_block).
  void count_free(Block* block) {
    update(stats_.allocation, block->small, -1);
    update(stats_.allocated_bytes, block->small, -static_cast<int64_t>(block->size));
    update(stats_.requested_bytes, block->small, -static_cast<int64_t>(block->requested));
  }

  // ---- private pools (Allocator.h) ----
  void retain_pool(c10::MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(id);
    if (it == pools_.end()) {
      pools_.emplace(id, PrivatePool{new_pool_key(), 1, false});
    } else {
      it->second.released = false;
      ++it->second.use_count;
    }
  }

  void release_pool(c10::MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(id);
    if (it == pools_.end() || it->second.use_count == 0) return;
    if (--it->second.use_count > 0) return;
    it->second.released = true;
    process_events();
    release_pool_segments(it->second.key);
  }

  int pool_use_count(c10::MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(id);
    return it == pools_.end() ? 0 : it->second.use_count;
  }

  void begin_routing(c10::MempoolId_t id, unsigned long long capture_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(id);
    TORCH_CHECK(it != pools_.end() && !it->second.released, "mydev allocator: no live memory pool ", id.first, ", ",
                id.second, " on mydev:", static_cast<int>(device_));
    routes_.push_back(Route{id, it->second.key, capture_id, std::this_thread::get_id()});
  }

  void end_routing(c10::MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    // The newest route to the pool from this thread (or for its capture).
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
      if (it->id == id && (it->capture != 0 || it->thread == std::this_thread::get_id())) {
        routes_.erase(std::next(it).base());
        return;
      }
    }
  }

  // ---- pool checkpoints (Allocator.h) ----
  std::vector<PoolCheckpoint::Segment> checkpoint_pool(c10::MempoolId_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    process_events();
    flush_bins();
    const mydevStream_t key = live_pool_key(id);
    std::vector<PoolCheckpoint::Segment> segments;
    for (Block* head : segments_) {
      if (head->stream != key) continue;
      PoolCheckpoint::Segment segment{head->ptr, {}};
      for (Block* b = head; b != nullptr; b = b->next) {
        segment.blocks.push_back({b->size, b->requested, b->allocated && !b->awaiting_free});
      }
      segments.push_back(std::move(segment));
    }
    return segments;
  }

  PoolRestore restore_pool(const PoolCheckpoint& checkpoint) {
    std::lock_guard<std::mutex> lock(mutex_);
    process_events();
    const mydevStream_t key = live_pool_key(checkpoint.id);
    PoolRestore result;
    // Every block allocated now is freed; its storage (if any is alive) is the caller's to disown.
    std::vector<Block*> allocated;
    for (Block* head : segments_) {
      if (head->stream != key) continue;
      for (Block* b = head; b != nullptr; b = b->next) {
        if (!b->allocated) continue;
        TORCH_CHECK(!b->awaiting_free, "mydev allocator: a block of memory pool ", checkpoint.id.first, ", ",
                    checkpoint.id.second, " is still used by another stream; synchronize before restoring the pool");
        allocated.push_back(b);
      }
    }
    for (Block* b : allocated) {  // freeing merges free neighbours only: the others stay valid
      live_.erase(b->ptr);
      result.freed.push_back(b->ptr);
      count_free(b);
      b->used_on.clear();
      release_block(b);
    }
    flush_bins();
    // Then the checkpoint's allocated blocks are cut out again at their addresses.
    for (const auto& segment : checkpoint.segments) {
      auto head = std::find_if(segments_.begin(), segments_.end(),
                               [&](Block* h) { return h->ptr == segment.base && h->stream == key; });
      TORCH_CHECK(head != segments_.end(), "mydev allocator: a segment of the checkpoint of memory pool ",
                  checkpoint.id.first, ", ", checkpoint.id.second, " is no longer in the pool");
      char* at = static_cast<char*>(segment.base);
      for (const auto& block : segment.blocks) {
        if (block.allocated) {
          take(cut_out(*head, at, block.size), block.requested, nullptr);
          result.allocated.push_back(at);
        }
        at += block.size;
      }
    }
    return result;
  }

  // Whether the live blocks of pool `id` are exactly those at `ptrs`.
  bool pool_allocations_are(c10::MempoolId_t id, const std::vector<void*>& ptrs) {
    std::lock_guard<std::mutex> lock(mutex_);
    process_events();
    const mydevStream_t key = live_pool_key(id);
    const std::set<void*> expected(ptrs.begin(), ptrs.end());
    size_t found = 0;
    for (Block* head : segments_) {
      if (head->stream != key) continue;
      for (Block* b = head; b != nullptr; b = b->next) {
        if (!b->allocated || b->awaiting_free) continue;
        if (expected.count(b->ptr) == 0) return false;
        ++found;
      }
    }
    return found == expected.size();
  }

  // Whether a kernel launched on `stream` may lease `ptr`'s block (allocated_for_stream).
  bool leasable(void* ptr, mydevStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return false;
    if (C10_UNLIKELY(!routes_.empty())) stream = route(stream, /*leases_only=*/true);
    return it->second->stream == stream;
  }

  void record_stream(Block* block, mydevStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stream == block->stream) return;
    for (mydevStream_t s : block->used_on) {
      if (s == stream) return;
    }
    block->used_on.push_back(stream);
  }

  // Frees every cached segment that is entirely unused, once the streams they
  // belong to have run what is queued. Returns bytes released.
  size_t release_cached() {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_for_busy_segments(lock);
    return release_cached_locked();
  }

  uint64_t clock() const {
    return clock_.load(std::memory_order_acquire);
  }

  DeviceStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* arr : stat_arrays()) {
      for (auto& s : *arr) s.reset_peak();
    }
  }

  void reset_accumulated() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* arr : stat_arrays()) {
      for (auto& s : *arr) s.reset_accumulated();
    }
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
  }

  void set_fraction(double fraction) {
    std::lock_guard<std::mutex> lock(mutex_);
    fraction_ = fraction;
  }

  void snapshot(std::vector<SegmentSnapshot>& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    process_events();
    flush_bins();
    for (Block* head : segments_) {
      SegmentSnapshot seg{device_, reinterpret_cast<uintptr_t>(head->ptr), 0, stream_key(head->stream),
                          head->small, 0, 0, {}};
      for (Block* b = head; b != nullptr; b = b->next) {
        using State = BlockSnapshot::State;
        const State state = !b->allocated ? State::Inactive
                            : b->awaiting_free ? State::ActiveAwaitingFree
                                               : State::ActiveAllocated;
        seg.total_size += b->size;
        if (state == State::ActiveAllocated) seg.allocated_size += b->size;
        if (state != State::Inactive) seg.active_size += b->size;
        seg.blocks.push_back({reinterpret_cast<uintptr_t>(b->ptr), b->size,
                              state == State::Inactive ? 0 : b->requested, state, b->context});
      }
      out.push_back(std::move(seg));
    }
  }

 private:
  std::vector<c10::CachingAllocator::StatArray*> stat_arrays() {
    return {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
            &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
            &stats_.inactive_split_bytes, &stats_.requested_bytes};
  }

  size_t capacity() {
    mydevDeviceProp prop{};
    MYDEV_CHECK(mydevGetDeviceProperties(&prop, device_));
    return prop.totalGlobalMem;
  }

  Block* new_segment(size_t size, bool small, mydevStream_t stream, size_t requested,
                     std::unique_lock<std::mutex>& lock) {
    const size_t cap = capacity();
    const size_t allowed = static_cast<size_t>(fraction_ * static_cast<double>(cap));
    auto reserved = [&] { return static_cast<size_t>(stats_.reserved_bytes[0].current); };
    void* ptr = nullptr;
    mydevError_t err = mydevErrorMemoryAllocation;
    auto try_malloc = [&] {
      if (reserved() + size <= allowed) {
        RuntimeDeviceGuard on_device(device_);
        err = mydevMalloc(&ptr, size);
      }
    };
    try_malloc();
    if (err == mydevErrorMemoryAllocation) {
      // Out of memory with blocks cached: give back those no queued kernel
      // can still use, and try once more.
      ++stats_.num_alloc_retries;
      release_cached_locked();
      try_malloc();
    }
    if (err == mydevErrorMemoryAllocation && !in_kernel()) {
      // Last resort, on a host thread: wait for the streams whose cached
      // segments are busy, and destroy finished kernels, whose references may
      // be the last ones to dead tensors. Both free memory only with the lock
      // released (a running kernel may be allocating; reaping frees blocks).
      // A kernel's own allocation cannot wait: its stream would wait for it.
      if (wait_for_busy_segments(lock) || has_finished_kernels()) {
        lock.unlock();
        reap_finished_kernels();
        lock.lock();
        process_events();
        release_cached_locked();
        try_malloc();
      }
    }
    if (err == mydevErrorMemoryAllocation) {
      ++stats_.num_ooms;
      size_t free_bytes = 0, total = 0;
      {
        RuntimeDeviceGuard on_device(device_);
        mydevMemGetInfo(&free_bytes, &total);
      }
      const size_t allocated = static_cast<size_t>(stats_.allocated_bytes[0].current);
      trace(TraceEntry::Action::Oom, device_, nullptr, requested, stream, nullptr, free_bytes);
      c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(requested), allocated, reserved(),
                                       c10::Device(kMyDev, device_));
      TORCH_CHECK_WITH(OutOfMemoryError, false, "mydev out of memory. Tried to allocate ",
          format_bytes(requested), ". mydev:", static_cast<int>(device_), " has a total capacity of ",
          format_bytes(total), " of which ", format_bytes(free_bytes), " is free. Of the allocated memory ",
          format_bytes(allocated), " is allocated by PyTorch, and ", format_bytes(reserved() - allocated),
          " is reserved by PyTorch but unallocated.",
          fraction_ < 1.0 ? " This process may reserve at most " + format_bytes(allowed) +
                                " (set_per_process_memory_fraction)."
                          : std::string(),
          " (MYDEV_MEMORY_LIMIT sets the capacity.)");
    }
    MYDEV_CHECK(err);
    ++stats_.num_device_alloc;
    update(stats_.segment, small, 1);
    update(stats_.reserved_bytes, small, static_cast<int64_t>(size));
    return new Block{device_, stream, size, ptr, small};
  }

  void release_block(Block* block) {
    trace(TraceEntry::Action::FreeCompleted, device_, block->ptr, block->size, block->stream);
    block->allocated = false;
    block->awaiting_free = false;
    block->context.reset();
    update(stats_.active, block->small, -1);
    update(stats_.active_bytes, block->small, -static_cast<int64_t>(block->size));
    block->freed_at = tick();
    if (bin(block)) return;
    merge_into_pool(block);
  }

  // Puts a free block back into its pool, merged with its free neighbours.
  void merge_into_pool(Block* block) {
    Pool& pool = block->small ? small_ : large_;
    for (Block* neighbour : {block->prev, block->next}) {
      if (neighbour == nullptr || neighbour->allocated || pool.count(neighbour) == 0) continue;
      pool.erase(neighbour);
      Block* first = neighbour == block->prev ? neighbour : block;
      Block* second = neighbour == block->prev ? block : neighbour;
      first->size += second->size;
      first->next = second->next;
      if (second->next) second->next->prev = first;
      delete second;
      block = first;
    }
    block->freed_at = tick();
    pool.insert(block);
  }

  // Small blocks freed and soon allocated again at the same size (the
  // tensors of a loop of small ops) skip the pool: a freed block of up to
  // kBinnedMax bytes waits, unmerged, in a bin of its stream and size, and an
  // allocation of that size on that stream takes it back. Splitting and merging
  // through the pool cost two heap allocations and four tree updates per
  // tensor. Whatever needs whole free blocks (giving segments back, an
  // allocation the bins cannot serve that would otherwise need a new segment,
  // snapshots) merges the bins into the pool first.
  static constexpr size_t kBinnedMax = 8 * kMinBlock;
  static constexpr size_t kBinDepth = 32;
  struct StreamBins {
    mydevStream_t stream;
    std::array<std::vector<Block*>, kBinnedMax / kMinBlock> by_size;  // [size / kMinBlock - 1]
  };

  bool bin(Block* block) {
    if (!block->small || block->size > kBinnedMax || block->stream == kScratch) return false;
    std::vector<Block*>& slot = bins_for(block->stream).by_size[block->size / kMinBlock - 1];
    if (slot.size() >= kBinDepth) return false;
    slot.push_back(block);
    ++binned_;
    return true;
  }

  Block* take_binned(mydevStream_t stream, size_t size) {
    if (binned_ == 0 || size > kBinnedMax) return nullptr;
    for (StreamBins& b : bins_) {
      if (b.stream != stream) continue;
      std::vector<Block*>& slot = b.by_size[size / kMinBlock - 1];
      if (slot.empty()) return nullptr;
      Block* block = slot.back();
      slot.pop_back();
      --binned_;
      return block;
    }
    return nullptr;
  }

  StreamBins& bins_for(mydevStream_t stream) {
    for (StreamBins& b : bins_) {
      if (b.stream == stream) return b;
    }
    bins_.push_back(StreamBins{stream, {}});
    return bins_.back();
  }

  void flush_bins() {
    if (binned_ == 0) return;
    for (StreamBins& b : bins_) {
      for (auto& slot : b.by_size) {
        for (Block* block : slot) merge_into_pool(block);
        slot.clear();
      }
    }
    binned_ = 0;
  }


  void process_events() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      bool done = true;
      for (const Event& e : it->second) {
        if (e.query() == mydevErrorNotReady) done = false;
      }
      if (!done) {
        ++it;
        continue;
      }
      release_block(it->first);
      it = pending_.erase(it);
    }
  }

  // Whether `stream` (null: the device's default stream) has no queued work.
  bool stream_idle(mydevStream_t stream) {
    if (stream == kScratch) return true;
    RuntimeDeviceGuard on_device(device_);
    return mydevStreamQuery(stream) != mydevErrorNotReady;
  }

  // Whole free segments, the only ones release_cached_locked gives back.
  template <class F>
  void for_each_free_segment(F&& f) {
    flush_bins();
    for (Pool* pool : {&small_, &large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        ++it;  // f may erase b
        if (b->prev == nullptr && b->next == nullptr) f(pool, b);
      }
    }
  }

  // Waits, with the lock released, until the streams of free segments have
  // run their queued work, so release_cached_locked can give them all back.
  // Returns whether it waited. Only on host threads: a kernel's own stream
  // could not finish while it waits.
  bool wait_for_busy_segments(std::unique_lock<std::mutex>& lock) {
    if (in_kernel()) return false;
    std::vector<mydevStream_t> busy;
    for_each_free_segment([&](Pool*, Block* b) {
      if (is_pool_key(b->stream)) return;  // released with its pool, not waited for
      if (std::find(busy.begin(), busy.end(), b->stream) == busy.end() && !stream_idle(b->stream)) {
        busy.push_back(b->stream);
      }
    });
    if (busy.empty()) return false;
    lock.unlock();
    {
      // An event rather than a stream synchronisation, which would take the
      // stream's pending kernel error from the caller's next synchronisation.
      RuntimeDeviceGuard on_device(device_);
      for (mydevStream_t s : busy) {
        std::optional<Event> e = Event::try_create();
        if (e && e->record(s) == mydevSuccess) e->synchronize();
      }
    }
    lock.lock();
    return true;
  }

  size_t release_cached_locked() {
    process_events();
    size_t released = 0;
    std::vector<std::pair<mydevStream_t, bool>> idle;  // queried once per stream
    auto is_idle = [&](mydevStream_t stream) {
      for (const auto& [s, ok] : idle) {
        if (s == stream) return ok;
      }
      idle.emplace_back(stream, stream_idle(stream));
      return idle.back().second;
    };
    // Inside a kernel, its own stream is busy (with it, at least), but blocks
    // of that stream free since before the kernel took its place there are
    // leased by no kernel still to run (see free_clock).
    const KernelContext* kernel = current_kernel();
    auto releasable = [&](const Block* b) {
      if (is_pool_key(b->stream)) return pool_released(b->stream);  // its graph may replay until released
      if (kernel != nullptr && kernel->device == device_ && kernel->stream == b->stream &&
          b->freed_at <= kernel->epoch) {
        return true;
      }
      return is_idle(b->stream);  // else a queued kernel may still use a leased block
    };
    for_each_free_segment([&](Pool* pool, Block* b) {
      if (releasable(b)) released += free_segment(pool, b);
    });
    return released;
  }

  mydevStream_t live_pool_key(c10::MempoolId_t id) const {
    auto it = pools_.find(id);
    TORCH_CHECK(it != pools_.end() && !it->second.released, "mydev allocator: no live memory pool ", id.first, ", ",
                id.second, " on mydev:", static_cast<int>(device_));
    return it->second.key;
  }

  // The block of `size` bytes at `at`, cut out of the free block of the
  // segment starting at `head` that holds those bytes.
  Block* cut_out(Block* head, char* at, size_t size) {
    Block* b = head;
    while (b != nullptr && static_cast<char*>(b->ptr) + b->size <= at) b = b->next;
    TORCH_CHECK(b != nullptr && !b->allocated && static_cast<char*>(b->ptr) + b->size >= at + size,
                "mydev allocator: the bytes of a checkpointed block are not free in their segment");
    Pool& pool = b->small ? small_ : large_;
    pool.erase(b);
    if (static_cast<char*>(b->ptr) < at) {
      Block* front = b;
      b = split(front, static_cast<size_t>(at - static_cast<char*>(front->ptr)));
      pool.insert(front);
    }
    if (b->size > size) pool.insert(split(b, size));
    return b;
  }

  // Gives a whole free segment back to the runtime; returns its size.
  size_t free_segment(Pool* pool, Block* b) {
    pool->erase(b);
    segments_.erase(b);
    trace(TraceEntry::Action::SegmentFree, device_, b->ptr, b->size, b->stream);
    mydevFree(b->ptr);  // a live allocation cannot fail to free; a forked child ignores it
    ++stats_.num_device_free;
    update(stats_.segment, b->small, -1);
    update(stats_.reserved_bytes, b->small, -static_cast<int64_t>(b->size));
    const size_t size = b->size;
    delete b;
    return size;
  }

  void release_pool_segments(mydevStream_t key) {
    for_each_free_segment([&](Pool* pool, Block* b) {
      if (b->stream == key) free_segment(pool, b);
    });
  }

  bool pool_released(mydevStream_t key) const {
    for (const auto& [id, p] : pools_) {
      if (p.key == key) return p.released;
    }
    return true;  // (a key outlives its pool's entry never: entries are kept)
  }

  // The key an allocation (or, `leases_only`, a lease) for `stream` uses
  // while routes are active: the newest route that applies, else the stream.
  mydevStream_t route(mydevStream_t stream, bool leases_only) {
    unsigned long long capture = 0;
    bool asked = false;
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
      if (it->capture == 0) {
        if (!leases_only && it->thread == std::this_thread::get_id()) return it->key;
        continue;
      }
      if (!asked) {
        mydevStreamCaptureStatus status = mydevStreamCaptureStatusNone;
        mydevStreamGetCaptureInfo(stream, &status, &capture);
        asked = true;
      }
      if (capture == it->capture) return it->key;
    }
    return stream;
  }

  // Advances the free clock. Only under mutex_, so a plain increment: no
  // locked read-modify-write on every free.
  uint64_t tick() {
    const uint64_t next = clock_.load(std::memory_order_relaxed) + 1;
    clock_.store(next, std::memory_order_release);
    return next;
  }

  const c10::DeviceIndex device_;
  std::mutex mutex_;
  // The allocated blocks by address. Device DataPtrs are "simple" (context ==
  // pointer) because CPU libraries that host kernels call, oneDNN among them,
  // allocate through the CPU allocator's raw_allocate/raw_deleter, which
  // require it: a block is found by its address. Open addressing: no heap
  // allocation per entry.
  ska::flat_hash_map<void*, Block*> live_;
  Pool small_, large_;
  std::set<Block*, std::less<>> segments_;  // the first block of each segment the runtime gave
  std::vector<std::pair<Block*, std::vector<Event>>> pending_;
  std::vector<StreamBins> bins_;  // see bin()
  size_t binned_ = 0;
  DeviceStats stats_;
  double fraction_ = 1.0;
  std::atomic<uint64_t> clock_{0};  // see free_clock; written under mutex_, read without it
  struct PrivatePool {
    mydevStream_t key;
    int use_count;
    bool released;
  };
  std::map<c10::MempoolId_t, PrivatePool> pools_;
  struct Route {
    c10::MempoolId_t id;
    mydevStream_t key;
    unsigned long long capture;  // 0: the thread's allocations
    std::thread::id thread;
  };
  std::vector<Route> routes_;
};

} // namespace device_cache
} // namespace my_device
