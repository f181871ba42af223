#pragma once
// Recycled memory for queued kernels' jobs.
//
// A structured kernel's job embeds a TensorIterator, over a kilobyte: larger
// than glibc's per-thread cache serves, so every small queued op paid for
// malloc's slow path (the largest single cost of a 1-element add in a profile).
// A job type that derives from Pooled<Job> takes its memory from a per-type
// free list instead. Jobs are created on host threads and destroyed on host
// threads (reap_finished_kernels), not necessarily the same one, hence the lock.
#include <cstddef>
#include <mutex>
#include <new>
#include <vector>

namespace my_device {

template <class T>
class Pooled {
 public:
  static void* operator new(std::size_t size) {
    if (size == sizeof(T)) {
      Pool& p = pool();
      std::lock_guard<std::mutex> lock(p.mutex);
      if (!p.free.empty()) {
        void* block = p.free.back();
        p.free.pop_back();
        return block;
      }
    }
    return ::operator new(size);
  }

  static void operator delete(void* block, std::size_t size) {
    if (size == sizeof(T)) {
      Pool& p = pool();
      std::lock_guard<std::mutex> lock(p.mutex);
      if (p.free.size() < kMaxFree) {
        p.free.push_back(block);
        return;
      }
    }
    ::operator delete(block);
  }

 private:
  // Enough for the jobs a busy stream has in flight; beyond that, memory goes back.
  static constexpr std::size_t kMaxFree = 256;
  struct Pool {
    std::mutex mutex;
    std::vector<void*> free;
  };
  static Pool& pool() {
    static Pool* p = new Pool();  // leaked: jobs may be reaped during static destruction
    return *p;
  }
};

} // namespace my_device
