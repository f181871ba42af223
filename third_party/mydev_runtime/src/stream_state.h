#pragma once
// What the stream files share: a stream's state (mydevStream_st), the stream
// table, and the functions each file gives the others. Internal to the runtime.
//   stream.cpp         streams and the table, submission, launches on the caller, the C API
//   stream_worker.cpp  a stream's worker thread, running tasks, the priority scheduler
//   stream_drain.cpp   hosts that wait run the queued work; synchronisation; process exit
// stream.cpp's opening comment describes how they fit together.
// atomic load per task.
#include "internal.h"

#include <cxxabi.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <new>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>


using mydev_detail::Task;

namespace mydev_detail {
// A stream's FIFO of tasks: a growable ring. A std::deque allocates a node on
// the submitting thread every few pushes and frees it on the worker, and that
// cross-thread pattern defeats malloc's per-thread caches on every launch.
class TaskRing {
 public:
  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }
  Task& front() { return slots_[head_]; }
  const Task& front() const { return slots_[head_]; }
  void push_back(Task&& t) {
    if (count_ == slots_.size()) grow();
    slots_[(head_ + count_) % slots_.size()] = std::move(t);
    ++count_;
  }
  void pop_front() {
    Task& done = slots_[head_];
    done.marker.reset();  // what the task held
    done.waiter = nullptr;
    head_ = (head_ + 1) % slots_.size();
    --count_;
  }
  void swap(TaskRing& other) {
    slots_.swap(other.slots_);
    std::swap(head_, other.head_);
    std::swap(count_, other.count_);
  }
  template <class F>
  void for_each(F&& f) {
    for (size_t i = 0; i < count_; ++i) f(slots_[(head_ + i) % slots_.size()]);
  }

 private:
  void grow() {
    std::vector<Task> bigger(slots_.empty() ? 64 : slots_.size() * 2);
    for (size_t i = 0; i < count_; ++i) bigger[i] = std::move(slots_[(head_ + i) % slots_.size()]);
    slots_.swap(bigger);
    head_ = 0;
  }
  std::vector<Task> slots_;
  size_t head_ = 0;
  size_t count_ = 0;
};

// The most queued-but-not-started tasks a stream holds before an enqueue waits
// (MYDEV_LAUNCH_QUEUE_DEPTH); SIZE_MAX when unlimited, so the submit fast path
// is a single comparison either way.
inline size_t launchQueueLimit() {
  const size_t depth = config().launch_queue_depth;
  return depth == 0 ? SIZE_MAX : depth;
}
}  // namespace mydev_detail

struct mydevStream_st {
  int device;
  int priority;
  uint64_t id;
  std::atomic<unsigned> delay_us{0};  // mydevTestSetStreamDelay
  // The capture the stream takes part in, 0 if none (graph.cpp): while set,
  // enqueued work becomes graph nodes instead of running.
  std::atomic<uint64_t> capture_id{0};

  std::mutex mu;
  std::condition_variable work_cv;  // the worker waits here for tasks
  std::condition_variable done_cv;  // synchronisers and blocking submitters wait here
  std::condition_variable room_cv;  // submitters waiting for room in a full queue wait here
  // Launch queue depth, fixed at creation. A submitter that found the queue
  // full is woken once it has drained to resume_at (see waitForRoom).
  const size_t queue_limit = mydev_detail::launchQueueLimit();
  const size_t resume_at = queue_limit / 2;
  // Everything below is guarded by mu (the atomics are only written under it).
  mydev_detail::TaskRing queue;
  // Each counter on a cache line of its own: an idle worker spins reading
  // `pushed` and synchronisers spin reading `completed`, and sharing a line
  // with the mutex and the queue made every launch take that line back from
  // the spinning core once more.
  alignas(64) std::atomic<uint64_t> enqueued{0};
  alignas(64) std::atomic<uint64_t> completed{0};
  // Entries put on `queue`: unlike `enqueued`, not moved by work a host runs
  // at the call on an idle stream, which gives the worker nothing to do.
  alignas(64) std::atomic<uint64_t> pushed{0};
  alignas(64) std::thread worker;
  bool worker_started = false;
  bool worker_sleeping = false;  // blocked on work_cv: the next enqueue must notify
  uint64_t worker_wakes = 0;     // enqueues that found it sleeping (mydevTestGetStreamWorkerWakes)
  bool worker_waiting_inline = false;  // blocked on work_cv until inline_held drops to 0
  bool worker_exited = false;
  bool stopping = false;   // destroyed or exiting: the worker leaves once the queue is empty
  bool abandoned = false;  // process exit: queue dropped, later work runs inline
  int waiters = 0;         // threads blocked on done_cv, woken at every completion
  // The smallest completion count a blocked synchroniser (waitIdle) waits for;
  // UINT64_MAX when none does. Synchronisers are woken when it is reached, not
  // at every completion (see notifyCompleted).
  uint64_t sync_wake_at = UINT64_MAX;
  int room_waiters = 0;    // threads blocked on room_cv
  int inline_held = 0;     // a LaunchHostFuncInline (or a draining host) holds the stream: the worker must not start work
  bool worker_in_task = false;   // the worker is running a task it took off the queue
  bool drainer_waiting = false;  // a draining host waits for that task to end (drainUntil)
  int blocked = 0;         // the worker (or inline caller) is waiting for other streams or an event
  bool counted = false;    // included in its device's runnable count (see updateRunnable)
  // Labels of the failed launches not yet reported, oldest first: each
  // synchronisation reports one, so a second failure is not lost behind the
  // first (its results are as wrong as the first's). error_label names the
  // last one reported, or the pending one if none was reported since.
  std::deque<std::string> failures;
  std::string error_label;

  ~mydevStream_st() {
    // Unreachable with a running worker (it holds a reference to its stream),
    // but never let a joinable std::thread terminate the process.
    if (worker.joinable()) worker.detach();
  }
};

namespace mydev_detail {

using S = mydevStream_st;


constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -1;
// How long an idle worker spins (yielding) before sleeping: long enough to
// bridge a host's gaps between launches while it runs Python between ops. A
// launch that wakes a sleeping worker pays a futex wake, which took the host
// 10-20 us on the 2-vCPU machines (its target core idle). With 50 us, greedy
// decoding woke the worker about 150 times a call of generate (20 tokens);
// with 1 ms, a fifth as many syscalls in all, and the call 5-10% faster. The
// price is a core kept busy up to 1 ms after a burst. Napping through most of
// that time instead (short sleeps, a host draining a napping worker's queue)
// changed neither decoding nor the test suite on two processes sharing two
// cores (bench/RESULTS.md, Decoding).
constexpr int64_t kWorkerSpinNs = 1000000;
// How long a compute unit's helper spins after its share of a task before
// sleeping (compute_units.cpp).
constexpr int64_t kHelperSpinNs = 200000;
// How long a synchroniser spins before blocking.
constexpr int64_t kSyncSpinNs = 20000;
// How long process exit waits for workers to finish the task they are running.
constexpr auto kExitGrace = std::chrono::seconds(1);
constexpr int kPriorityLevels = kLeastPriority - kGreatestPriority + 1;
// How long a worker held back by a higher-priority stream spins before
// sleeping: such streams usually drain within a few short kernels.
constexpr int64_t kGateSpinNs = 20000;

// Per device: how many streams of each priority level are runnable, and where
// workers held back by them sleep. Level 0 is the greatest priority.
struct DeviceSchedule {
  std::atomic<int> runnable[kPriorityLevels] = {};
  std::mutex mu;
  std::condition_variable cv;
};

struct StreamTable {
  std::mutex mu;
  std::unordered_map<S*, std::shared_ptr<S>> live;  // user-created
  std::vector<std::shared_ptr<S>> defaults;         // one per device
  std::atomic<uint64_t> next_id{1};                 // 0: default streams
  DeviceSchedule* schedule = nullptr;               // one per device
};


StreamTable& table();

// The stream whose worker this thread is (or whose LaunchHostFuncInline it is
// running); null otherwise.
extern MYDEV_HOT_TLS thread_local S* t_worker_stream;

// Set once process exit has stopped the workers: from then on work runs
// inline, even on streams created later (say, by a static destructor).
extern std::atomic<bool> g_exiting;

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() or for about `ns`; returns done(). After a short busy
// phase it yields, so that when the thread it waits for shares its core (a
// loaded machine) that thread gets to run instead of waiting out the spin.
template <class Pred>
bool spinUntil(Pred done, int64_t ns) {
  const auto start = std::chrono::steady_clock::now();
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    if (i < 256) {
      cpuRelax();
    } else {
      std::this_thread::yield();
    }
    if ((i & 63) == 0 && std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(ns)) {
      return done();
    }
  }
}

// Restores the caller's current device after a launched function, which runs
// "on" its stream's device as a kernel would.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : saved_(currentDevice()) {
    if (saved_ != device) setCurrentDevice(device);
  }
  ~DeviceGuard() {
    if (currentDevice() != saved_) setCurrentDevice(saved_);
  }

 private:
  int saved_;
};

// A launched function's body: on the stream's device, and an exception
// escaping it (a "kernel" crashing) turned into its failure. It reaches device
// memory through kernel addresses (mydevKernelAddress), so nothing is opened.
MYDEV_ALWAYS_INLINE int callLaunched(int device, mydevHostFn_t fn, void* user_data) {
  DeviceGuard guard(device);
  try {
    return fn(user_data);
  } catch (abi::__forced_unwind&) {
    throw;  // thread cancellation must keep unwinding
  } catch (...) {
    return -1;
  }
}

// What a launch, copy or memset task is reported as to activity tracing.
inline mydevActivityKind activityKindOf(const Task& t) {
  return t.kind == Task::Kind::kLaunch ? mydevActivityKindKernel
         : t.kind == Task::Kind::kCopy ? mydevActivityKindMemcpy
                                       : mydevActivityKindMemset;
}

// stream_worker.cpp
DeviceSchedule& schedule(const S& s);
void updateRunnable(S& s);
bool higherPriorityRunnable(const S& s);
void emitActivity(const S& s, mydevActivityKind kind, const char* label, uint64_t correlation, int64_t start,
                  int64_t end, size_t bytes, bool inline_launch);
int runDataTask(void* task);
void recordFailure(S& s, const char* label);
void recordCallerFailure(S& s, const char* label);
void notifyCompleted(S& s);
void runFront(S& s, std::unique_lock<std::mutex>& lock, bool on_worker);
bool ensureWorker(const std::shared_ptr<S>& sp);
mydevError_t runInline(S& s, Task& t);

// stream_drain.cpp
bool mayDrain(const S& s);
[[nodiscard]] bool releaseHold(S& s);
bool drainUntil(S& s, std::unique_lock<std::mutex>& lock, uint64_t target);
bool drainToTarget(S& s, uint64_t target);
void waitIdle(S& s);
mydevError_t takeStickyError(S& s);
mydevError_t synchronizeStream(S& s);
std::vector<std::shared_ptr<S>> deviceStreams(int device);
void stopWorkersAtExit();

}  // namespace mydev_detail
