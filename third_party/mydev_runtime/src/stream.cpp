// Streams: ordered queues of device work, each on one device, each executed by
// its own worker thread.
//
// A stream's worker is started by the first enqueue (so a process that never
// launches anything, or a child forked before initialisation, pays nothing)
// and runs tasks strictly in FIFO order. Submitting is a lock, a deque push and
// a notify only when the worker sleeps. After draining its queue the worker
// spins briefly (bursts of launches then cost no futex wake) and then sleeps.
//
// Launch queue depth. Unbounded queues would let a host thread run any
// distance ahead of a stream, each queued task pinning the memory of the
// tensors it uses; a GPU bounds this instead (CUDA's launch queue holds about
// 1024 entries, then a launch blocks). So a stream holds at most `queue_limit`
// tasks queued but not yet started (MYDEV_LAUNCH_QUEUE_DEPTH, default 1024,
// 0 for none), and an enqueue that finds it full waits on room_cv until the
// worker has started enough of them. Below the limit this costs the submit
// path one comparison (no limit is a limit of SIZE_MAX). A waiting submitter
// is woken when the queue is down to half the limit (resume_at), not at every
// freed slot: a host far ahead then costs one wake-up per half queue instead
// of one per task, and the worker still has half a queue in hand meanwhile.
//
// Waiting for room must never deadlock (waitForRoom has the details):
//  - work of the stream itself (its worker, or an inline function holding the
//    worker) never waits, and may overfill the queue: it would wait for itself;
//  - work of another stream waits as a blocked stream, so it does not hold back
//    the full stream if that has lower priority, but overfills rather than
//    waits when the full stream's own worker is blocked or held: the two may
//    be waiting for each other;
//  - plain host threads always wait, as a CUDA launch on a full queue does.
// An inline call's gate takes a slot but never waits for one, since its caller
// waits for the whole queue anyway. Under MYDEV_LAUNCH_BLOCKING=1 each host
// thread has at most one task queued, so the limit only matters with more
// submitting threads than it. Destroy and process exit wake waiting submitters:
// after a destroy their enqueue fails like any on a destroyed stream, after
// exit their work runs inline like any work enqueued then.
//
// Counters: `enqueued` and `completed` only grow, and are written under the
// stream's mutex (atomics so spinning waiters can read them without it).
// Synchronising means waiting until `completed` reaches the `enqueued` value
// seen at the call; work enqueued concurrently by other threads is not waited for.
//
// Priorities, like a GPU's block scheduler: a worker does not start a task
// while a stream of higher priority on its device is runnable, i.e. has queued
// tasks and a worker that can run them (not waiting for an event, an inline
// caller, or a synchronisation with other streams). Blocked streams are left
// out because what they wait for may be queued behind the gate; counting them
// could deadlock. A running task is never pre-empted. Each device keeps one
// atomic count of runnable streams per priority level, changed only when a
// stream of above-least priority turns runnable or stops being so, so a launch
// on a least-priority stream never touches it and the gate costs a worker one
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
  // `enqueued` and synchronisers spin reading `completed`, and sharing a line
  // with the mutex and the queue made every launch take that line back from
  // the spinning core once more.
  alignas(64) std::atomic<uint64_t> enqueued{0};
  alignas(64) std::atomic<uint64_t> completed{0};
  alignas(64) std::thread worker;
  bool worker_started = false;
  bool worker_sleeping = false;  // blocked on work_cv: the next enqueue must notify
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
namespace {

using S = mydevStream_st;

constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -1;
// How long an idle worker spins before sleeping: long enough to bridge the
// host's usual gap between two launches (waking a sleeping worker costs a
// futex wake, several microseconds), short enough not to burn a core.
constexpr int64_t kWorkerSpinNs = 50000;
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

// Leaked on purpose, for the same exit-order reason as the memory registry
// (and so stream workers still running at exit never see their stream freed).
StreamTable& table() {
  static StreamTable* t = [] {
    auto* st = new StreamTable();
    st->schedule = new DeviceSchedule[static_cast<size_t>(config().device_count)];
    for (int d = 0; d < config().device_count; ++d) {
      auto s = std::make_shared<S>();
      s->device = d;
      s->priority = kLeastPriority;
      s->id = 0;
      st->defaults.push_back(std::move(s));
    }
    return st;
  }();
  return *t;
}

// The stream whose worker this thread is (or whose LaunchHostFuncInline it is
// running); null otherwise.
MYDEV_HOT_TLS thread_local S* t_worker_stream = nullptr;

// Set once process exit has stopped the workers: from then on work runs
// inline, even on streams created later (say, by a static destructor).
std::atomic<bool> g_exiting{false};

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

DeviceSchedule& schedule(const S& s) { return table().schedule[static_cast<size_t>(s.device)]; }

int priorityLevel(int priority) { return priority - kGreatestPriority; }

// Keeps the device's runnable count in step with the stream. Caller holds s.mu
// (lock order: stream, then device schedule). Called after every change to the
// queue, inline_held, blocked or abandoned.
void updateRunnable(S& s) {
  // Nothing is held back by least-priority work, so those streams skip the count.
  if (s.priority >= kLeastPriority) return;
  const bool runnable = !s.queue.empty() && s.inline_held == 0 && s.blocked == 0 && !s.abandoned;
  if (runnable == s.counted) return;
  s.counted = runnable;
  DeviceSchedule& d = schedule(s);
  std::atomic<int>& count = d.runnable[priorityLevel(s.priority)];
  if (runnable) {
    count.fetch_add(1, std::memory_order_seq_cst);
  } else if (count.fetch_sub(1, std::memory_order_seq_cst) == 1) {
    // Taking the mutex orders this against a worker between its check and its wait.
    std::lock_guard<std::mutex> lock(d.mu);
    d.cv.notify_all();
  }
}

bool higherPriorityRunnable(const S& s) {
  const int level = priorityLevel(s.priority);
  if (level == 0) return false;
  DeviceSchedule& d = schedule(s);
  for (int l = 0; l < level; ++l) {
    if (d.runnable[l].load(std::memory_order_seq_cst) > 0) return true;
  }
  return false;
}

// Waits until no stream of higher priority on the device is runnable, or the
// process is exiting. Called by the stream's worker without s.mu.
void waitForHigherPriority(const S& s) {
  auto clear = [&] { return !higherPriorityRunnable(s) || g_exiting.load(std::memory_order_relaxed); };
  if (spinUntil(clear, kGateSpinNs)) return;
  DeviceSchedule& d = schedule(s);
  std::unique_lock<std::mutex> lock(d.mu);
  d.cv.wait(lock, clear);
}

// Names the worker for debuggers and profilers ("mydev0:s3", "mydev1:def").
void nameWorkerThread(const S& s) {
  char name[48];
  if (s.id == 0) {
    std::snprintf(name, sizeof(name), "mydev%d:def", s.device);
  } else {
    std::snprintf(name, sizeof(name), "mydev%d:s%llu", s.device, static_cast<unsigned long long>(s.id));
  }
  name[15] = '\0';  // the kernel's limit, NUL included
  pthread_setname_np(pthread_self(), name);
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

// The activity record of a traced task (or inline function) that ran on s.
void emitActivity(const S& s, mydevActivityKind kind, const char* label, uint64_t correlation, int64_t start,
                  int64_t end, size_t bytes, bool inline_launch) {
  mydevActivityRecord r{};
  r.kind = kind;
  r.device = s.device;
  r.stream = s.id == 0 ? nullptr : const_cast<S*>(&s);  // the default stream's handle is NULL
  r.label = label ? label : "";
  r.correlation_id = correlation;
  r.start_ns = start;
  r.end_ns = end;
  r.bytes = bytes;
  r.inline_launch = inline_launch ? 1 : 0;
  activityEmit(r);
}

// What a launch, copy or memset task is reported as to activity tracing.
mydevActivityKind activityKindOf(const Task& t) {
  return t.kind == Task::Kind::kLaunch ? mydevActivityKindKernel
         : t.kind == Task::Kind::kCopy ? mydevActivityKindMemcpy
                                       : mydevActivityKindMemset;
}

// Runs a task, reporting it to activity tracing if it was traced.
int runTask(const S& s, Task& t);
int runTracedTask(const S& s, Task& t) {
  const bool traced = t.traced && (t.kind == Task::Kind::kLaunch || t.kind == Task::Kind::kCopy ||
                                   t.kind == Task::Kind::kMemset);
  if (!traced) return runTask(s, t);
  const int64_t start = activityClockNs();
  const int rc = runTask(s, t);
  emitActivity(s, activityKindOf(t), t.label, t.correlation, start, activityClockNs(),
               t.kind == Task::Kind::kLaunch ? 0 : t.count, false);
  return rc;
}

// Executes a copy or memset task (given as a mydevHostFn_t's argument).
int runDataTask(void* task) {
  const Task& t = *static_cast<const Task*>(task);
  if (t.kind == Task::Kind::kCopy) {
    // Kernel addresses, translated when the copy was validated. memmove: a
    // device-to-device copy within one allocation may overlap.
    std::memmove(t.ptr, t.src, t.count);
  } else {
    std::memset(t.ptr, t.value, t.count);  // kernel address, as for copies
  }
  return 0;
}

// Executes one task; nonzero means a failed launch.
int runTask(const S& s, Task& t) {
  switch (t.kind) {
    case Task::Kind::kLaunch:
      return callLaunched(s.device, t.fn, t.ptr);
    case Task::Kind::kCopy:
    case Task::Kind::kMemset:
      return runDataTask(&t);
    case Task::Kind::kEventRecord:
      return 0;  // completed by the worker loop, once the task is counted
    case Task::Kind::kEventWait:
      waitMarker(*t.marker);
      return 0;
    case Task::Kind::kInlineGate:
      return 0;  // handled by the worker loop
  }
  return 0;
}

// Caller holds s.mu.
void recordFailure(S& s, const char* label) {
  // (Bounded: a loop of failing launches must not grow the stream without end.)
  constexpr size_t kMaxPendingFailures = 1024;
  if (s.failures.size() >= kMaxPendingFailures) return;
  if (s.failures.empty()) s.error_label = label;
  s.failures.emplace_back(label);
}

// The failure of fn run on the calling thread (runHeld), whose label is the
// caller's: truncated as queued tasks' labels are (Task::label).
void recordCallerFailure(S& s, const char* label) {
  const std::string kept(label ? label : "", label ? strnlen(label, MYDEV_MAX_LABEL_LENGTH) : 0);
  std::lock_guard<std::mutex> lock(s.mu);
  recordFailure(s, kept.c_str());
}

// Caller holds s.mu and has just counted one or more completions. A host
// synchronising a long queue used to be woken by every completed task, only to
// find its target not reached and sleep again: a futex wake per task on the
// worker's side of the hand-off (in a VM, an inter-processor interrupt each),
// which made a queue of 20 us matrix products run 1.2-1.9x slower than the
// same products run on the host.
void notifyCompleted(S& s) {
  const bool target_reached = s.completed.load(std::memory_order_relaxed) >= s.sync_wake_at;
  if (target_reached) s.sync_wake_at = UINT64_MAX;  // each woken synchroniser re-registers its own
  if (target_reached || s.waiters || s.drainer_waiting) s.done_cv.notify_all();
}

// Runs the task at the front of s's queue on the calling thread and counts it
// completed: the worker's step, and a draining host's (drainUntil). Caller
// holds `lock` on s.mu, which is released while the task runs.
void runFront(S& s, std::unique_lock<std::mutex>& lock, bool on_worker) {
  int rc;
  BlockingWait* waiter;
  std::shared_ptr<EventMarker> reached_marker;
  char failed_label[Task::kLabelCapacity];
  {
    Task task = std::move(s.queue.front());
    s.queue.pop_front();
    updateRunnable(s);
    // Submitters waiting for room resume only once half the queue has
    // drained: one wake per batch of tasks, not one per task.
    if (s.room_waiters && s.queue.size() <= s.resume_at) s.room_cv.notify_all();
    if (on_worker) s.worker_in_task = true;
    lock.unlock();
    rc = runTracedTask(s, task);
    waiter = task.waiter;
    if (task.kind == Task::Kind::kEventRecord) reached_marker = std::move(task.marker);
    if (rc != 0) std::memcpy(failed_label, task.label, std::strlen(task.label) + 1);
  }  // the task is released outside the lock
  lock.lock();
  if (on_worker) s.worker_in_task = false;
  if (rc != 0) recordFailure(s, failed_label);
  s.completed.store(s.completed.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  // Under the stream lock and after counting the task, so whoever sees the
  // event complete also sees the stream past it (lock order: stream, marker).
  if (reached_marker) completeMarker(*reached_marker);
  if (waiter) {
    waiter->rc = rc;
    waiter->done = true;
  }
  notifyCompleted(s);
}

void workerLoop(std::shared_ptr<S> keep_alive) {
  S& s = *keep_alive;
  t_worker_stream = &s;
  setCurrentDevice(s.device);
  nameWorkerThread(s);
  std::unique_lock<std::mutex> lock(s.mu);
  bool delayed = false;  // the test delay of the task at the front has been served
  for (;;) {
    if (s.inline_held > 0 && !s.abandoned) {
      // A host thread is running a LaunchHostFuncInline in this stream's order.
      s.worker_waiting_inline = true;
      s.work_cv.wait(lock, [&] { return s.inline_held == 0 || s.abandoned; });
      s.worker_waiting_inline = false;
      continue;
    }
    if (s.queue.empty()) {
      if (s.stopping) break;
      const uint64_t seen = s.completed.load(std::memory_order_relaxed);
      lock.unlock();
      spinUntil([&] { return s.enqueued.load(std::memory_order_acquire) != seen; }, kWorkerSpinNs);
      lock.lock();
      while (s.queue.empty() && !s.stopping) {
        s.worker_sleeping = true;
        s.work_cv.wait(lock);
      }
      s.worker_sleeping = false;
      continue;
    }
    if (s.queue.front().kind == Task::Kind::kInlineGate) {
      // Hand the stream to the inline caller, who counts the gate completed
      // when its function returns.
      ++s.inline_held;
      BlockingWait* gate = s.queue.front().waiter;
      gate->rc = 1;  // held
      gate->done = true;
      s.queue.pop_front();
      updateRunnable(s);
      s.done_cv.notify_all();
      // The stream is now held: a submitter from another stream's work must
      // stop waiting for room in it (see waitForRoom).
      if (s.room_waiters) s.room_cv.notify_all();
      continue;
    }
    if (unsigned delay = delayed ? 0 : s.delay_us.load(std::memory_order_relaxed)) {
      // Test hook. Interruptible by process exit, which drops the queue.
      s.work_cv.wait_for(lock, std::chrono::microseconds(delay), [&] { return s.abandoned; });
      delayed = true;
      continue;  // the wait released the lock: check the stream again (it may be held now)
    }
    // After the delay (which stands for the task's device time), so that a
    // delayed worker still gives way to work that became runnable meanwhile.
    // The inline gate above is not held back: its caller runs on the host.
    if (higherPriorityRunnable(s)) {
      lock.unlock();
      waitForHigherPriority(s);
      lock.lock();
      continue;
    }
    if (g_exiting.load(std::memory_order_relaxed) && !s.abandoned) {
      // Exit drops every stream's queue, one stream after another, and this
      // one's turn has not come: start nothing meanwhile (a worker held back by
      // a higher-priority stream would otherwise run its task as soon as that
      // stream's queue was dropped).
      s.work_cv.wait(lock, [&] { return s.abandoned; });
      continue;
    }
    delayed = false;
    runFront(s, lock, /*on_worker=*/true);
  }
  s.worker_exited = true;
  s.done_cv.notify_all();
}

// Starts the stream's worker if it has none. Caller holds s.mu. False if no
// thread could be created.
bool ensureWorker(const std::shared_ptr<S>& sp) {
  S& s = *sp;
  if (s.worker_started) return true;
  try {
    s.worker = std::thread(workerLoop, sp);
  } catch (...) {
    return false;
  }
  s.worker_started = true;
  return true;
}

// Runs a task in the calling thread: the fallback when no worker can run it
// (none could be started, or the process is exiting). Nothing is pending then,
// so order is preserved.
mydevError_t runInline(S& s, Task& t) {
  int rc = runTask(s, t);
  if (t.kind == Task::Kind::kEventRecord) completeMarker(*t.marker);
  if (rc == 0) return mydevSuccess;
  std::lock_guard<std::mutex> lock(s.mu);
  recordFailure(s, t.label);
  return config().launch_blocking ? mydevErrorLaunchFailure : mydevSuccess;
}

// ---- Hosts that wait run the queued work ------------------------------------
// A host thread waiting for a stream (a synchronisation, an event's up to its
// record, a host kernel behind queued work) would otherwise sleep while the
// worker runs the queue, and be woken at the end. Instead it takes the stream
// over between two tasks and runs the rest itself, in order, on its own core.
// Two reasons, both measured on the 2-vCPU machines: the closing wake-up (a
// futex wake and, in a VM, an inter-processor interrupt) leaves the critical
// path; and the work no longer runs at the speed of whichever vCPU the worker
// sits on, which against the host's varied between 0.76x and 1.33x (5th and
// 95th percentiles over 9 ms samples), so that a queue of matrix products
// synchronised at the end took up to 1.24x the time the host took for the
// same products.
//
// What stays the worker's: the task it is running (the host waits for it to
// end); a stream with a test delay (which stands for device time the host
// cannot spend for it); streams above least priority (a host cannot be held
// back by the priority scheduler as a worker is); an inline call's gate, and an
// event wait not yet satisfied (which the worker waits out as a blocked stream).
// Stream work (a kernel synchronising another stream) never drains: it waits
// as a blocked stream, as before.

// Whether the calling thread may drain s: a plain host thread, on a stream
// whose work a host may run.
bool mayDrain(const S& s) {
  return t_worker_stream == nullptr && s.priority == kLeastPriority &&
         s.delay_us.load(std::memory_order_relaxed) == 0;
}

// Whether the task at the front of s's (non-empty) queue may run on a draining
// host. Caller holds s.mu (lock order: stream, then marker).
bool frontDrainable(const S& s) {
  const Task& t = s.queue.front();
  if (t.kind == Task::Kind::kInlineGate) return false;
  if (t.kind == Task::Kind::kEventWait) {
    std::lock_guard<std::mutex> marker(t.marker->mu);
    return t.marker->done;
  }
  return true;
}

// Ends a hold of the stream taken on the calling thread. Caller holds s.mu.
// Returns whether the worker waits for the hold to end: the caller then wakes
// it (work_cv), after unlocking where it can. Only that worker needs a
// wake-up: one sleeping for work is woken by the next enqueue, and waking it
// after every short task run on a host would cost a futex call each.
[[nodiscard]] bool releaseHold(S& s) {
  --s.inline_held;
  updateRunnable(s);
  return s.worker_waiting_inline;
}

// Caller holds `lock` on s.mu and may drain s (mayDrain). Takes the stream from
// its worker (inline_held, as an inline call does) and runs its queued tasks on
// the calling thread until `completed` reaches `target`. Returns true once it
// has, still holding the stream (the caller releases it, or runs its own work
// first); false, holding nothing, if it had to stop first (see above), and the
// caller then waits for the worker.
bool drainUntil(S& s, std::unique_lock<std::mutex>& lock, uint64_t target) {
  auto reached = [&] { return s.completed.load(std::memory_order_relaxed) >= target; };
  if (s.abandoned || s.stopping || s.inline_held > 0 || s.blocked > 0 || s.queue.empty() || !frontDrainable(s)) {
    return false;
  }
  ++s.inline_held;  // the worker starts nothing more
  updateRunnable(s);
  if (s.worker_in_task) {
    // Its current task ends first. Queued work is often short: spin a little
    // before sleeping (notifyCompleted wakes a drainer that sleeps).
    const uint64_t seen = s.completed.load(std::memory_order_relaxed);
    lock.unlock();
    spinUntil([&] { return s.completed.load(std::memory_order_acquire) != seen; }, kSyncSpinNs);
    lock.lock();
    s.drainer_waiting = true;
    s.done_cv.wait(lock, [&] { return !s.worker_in_task || s.abandoned; });
    s.drainer_waiting = false;
  }
  // While tasks run here this thread is "in" the stream, as its worker is.
  t_worker_stream = &s;
  while (!reached() && !s.abandoned && !s.queue.empty() && frontDrainable(s) &&
         s.delay_us.load(std::memory_order_relaxed) == 0 && !higherPriorityRunnable(s)) {
    runFront(s, lock, /*on_worker=*/false);
  }
  t_worker_stream = nullptr;
  if (reached()) return true;
  if (releaseHold(s)) s.work_cv.notify_all();
  return false;
}

// waitIdle's first resort: drains s up to target if it can, and reports
// whether target was reached.
bool drainToTarget(S& s, uint64_t target) {
  // (A hint without the lock: one task outstanding is the one the worker is
  // running or about to take, and there is nothing to take over.)
  if (s.enqueued.load(std::memory_order_acquire) - s.completed.load(std::memory_order_acquire) < 2) return false;
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.completed.load(std::memory_order_relaxed) >= target) return true;  // (what is queued now is later work)
  if (!drainUntil(s, lock, target)) return false;
  if (releaseHold(s)) s.work_cv.notify_all();
  return true;
}

// Waits until everything enqueued on s before the call has completed. Never
// waits for the calling worker's own stream, which would deadlock.
void waitIdle(S& s) {
  if (t_worker_stream == &s) return;
  const uint64_t target = s.enqueued.load(std::memory_order_acquire);
  auto reached = [&] { return s.completed.load(std::memory_order_acquire) >= target; };
  if (reached()) return;
  if (mayDrain(s) && drainToTarget(s, target)) return;
  BlockedScope blocked;
  if (spinUntil(reached, kSyncSpinNs)) return;
  std::unique_lock<std::mutex> lock(s.mu);
  while (!reached()) {
    s.sync_wake_at = std::min(s.sync_wake_at, target);
    s.done_cv.wait(lock);
  }
}

mydevError_t takeStickyError(S& s) {
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.failures.empty()) return mydevSuccess;
  s.error_label = std::move(s.failures.front());
  s.failures.pop_front();
  return mydevErrorLaunchFailure;
}

mydevError_t synchronizeStream(S& s) {
  waitIdle(s);
  return takeStickyError(s);
}

std::vector<std::shared_ptr<S>> deviceStreams(int device) {
  StreamTable& t = table();
  std::vector<std::shared_ptr<S>> streams{t.defaults[static_cast<size_t>(device)]};
  std::lock_guard<std::mutex> lock(t.mu);
  for (const auto& [handle, s] : t.live) {
    if (s->device == device) streams.push_back(s);
  }
  return streams;
}

// Process exit: drop queued work, let workers finish the task in hand (for a
// bounded time) and join them. A worker stuck in a task is left running; the
// process ends it. Pending work never delays exit by more than kExitGrace.
void stopWorkersAtExit() {
  // A poisoned child inherited this handler but not the threads.
  if (inPoisonedChild()) return;
  g_exiting.store(true);
  StreamTable& t = table();
  // Workers held back by priority leave that wait on g_exiting.
  for (int d = 0; d < config().device_count; ++d) {
    std::lock_guard<std::mutex> lock(t.schedule[d].mu);
    t.schedule[d].cv.notify_all();
  }
  std::vector<std::shared_ptr<S>> streams;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    streams = t.defaults;
    for (const auto& [handle, s] : t.live) streams.push_back(s);
  }
  for (const auto& s : streams) {
    mydev_detail::TaskRing dropped;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->stopping = true;
      s->abandoned = true;
      dropped.swap(s->queue);
      uint64_t gates = 0;
      dropped.for_each([&](Task& task) {
        if (task.waiter) task.waiter->done = true;
        // A released inline caller runs its function and counts its gate itself.
        if (task.kind == Task::Kind::kInlineGate) ++gates;
      });
      s->completed.store(s->completed.load(std::memory_order_relaxed) + dropped.size() - gates,
                         std::memory_order_release);
      updateRunnable(*s);
    }
    s->work_cv.notify_all();
    s->done_cv.notify_all();
    s->room_cv.notify_all();  // submitters waiting for room now run their work inline
    // Dropped markers complete, so nothing (a worker in a StreamWaitEvent, a
    // thread in EventSynchronize) waits for them forever.
    dropped.for_each([](Task& task) {
      if (task.kind == Task::Kind::kEventRecord) completeMarker(*task.marker);
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + kExitGrace;
  for (const auto& s : streams) {
    std::unique_lock<std::mutex> lock(s->mu);
    if (!s->worker_started || t_worker_stream == s.get()) continue;
    ++s->waiters;
    bool exited = s->done_cv.wait_until(lock, deadline, [&] { return s->worker_exited; });
    --s->waiters;
    if (!exited) continue;
    std::thread worker = std::move(s->worker);
    lock.unlock();
    if (worker.joinable()) worker.join();
  }
}

}  // namespace

void drainToRecord(EventMarker& m) {
  std::shared_ptr<S> s;
  uint64_t position;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.done) return;
    s = m.stream.lock();
    position = m.position;
  }
  if (s && mayDrain(*s)) drainToTarget(*s, position);
}

void initDefaultStreams() {
  (void)table();
  std::atexit(stopWorkersAtExit);
}

bool onStreamWorker() { return t_worker_stream != nullptr; }

bool runtimeExiting() { return g_exiting.load(std::memory_order_relaxed); }

uint64_t streamCaptureId(const S& s) { return s.capture_id.load(std::memory_order_acquire); }
void setStreamCaptureId(S& s, uint64_t id) { s.capture_id.store(id, std::memory_order_release); }

void recordWorkerFailure(const char* label) {
  S* s = t_worker_stream;
  if (!s) return;
  std::lock_guard<std::mutex> lock(s->mu);
  recordFailure(*s, label);
}

BlockedScope::BlockedScope() : stream_(t_worker_stream) {
  if (!stream_) return;
  std::lock_guard<std::mutex> lock(stream_->mu);
  ++stream_->blocked;
  updateRunnable(*stream_);
  // Submitters from other streams' work stop waiting for room in this stream
  // now that its worker is blocked (see waitForRoom).
  if (stream_->room_waiters) stream_->room_cv.notify_all();
}

BlockedScope::~BlockedScope() {
  if (!stream_) return;
  std::lock_guard<std::mutex> lock(stream_->mu);
  --stream_->blocked;
  updateRunnable(*stream_);
}

// The default stream `handle` names explicitly (mydevDeviceGetDefaultStream),
// or null if it names none. A scan of a few pointers: default streams are never
// destroyed, while any other handle may be a destroyed stream's, which only the
// locked table may tell.
const std::shared_ptr<S>* defaultStreamOf(mydevStream_t handle) {
  for (const auto& s : table().defaults) {
    if (s.get() == handle) return &s;
  }
  return nullptr;
}

mydevError_t resolveStream(mydevStream_t handle, std::shared_ptr<S>* out) {
  StreamTable& t = table();
  if (!handle) {
    *out = t.defaults[static_cast<size_t>(currentDevice())];
    return mydevSuccess;
  }
  if (const std::shared_ptr<S>* d = defaultStreamOf(handle)) {
    *out = *d;
    return mydevSuccess;
  }
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.live.find(handle);
  if (it == t.live.end()) return mydevErrorInvalidResourceHandle;
  *out = it->second;
  return mydevSuccess;
}

int streamDevice(const S& stream) { return stream.device; }

bool isDefaultStream(const S& stream) { return defaultStreamOf(const_cast<S*>(&stream)) != nullptr; }

namespace {

// submitToStream's slow path, taken when s's queue holds queue_limit tasks.
// Releases `lock` (on s.mu) and waits until the worker has started enough of
// them that the queue is down to resume_at (hysteresis, so a host far ahead
// is woken once per batch rather than per task), or the stream is stopping or
// abandoned; then relocks and returns true, and the caller checks again, since
// other submitters may have taken the room first. Returns false at once, and
// the caller enqueues past the limit, where waiting could deadlock:
//  - on the caller's own stream: its worker, or an inline function holding
//    that worker, would be waiting for itself;
//  - from another stream's work (a worker or an inline function) while this
//    stream's worker is blocked (waiting for other streams or an event) or
//    held by an inline function: what it waits for may be the calling stream,
//    which is about to block too (two streams' tasks feeding each other's full
//    queues). Both sides' `blocked` are set under their own locks before the
//    other's is read, so of two such submitters at least one sees the other.
// A worker waiting here is blocked for the priority scheduler, as in any
// cross-stream wait, so a full low-priority stream it waits for is not held
// back by its own high-priority queue.
__attribute__((noinline)) bool waitForRoom(S& s, std::unique_lock<std::mutex>& lock) {
  if (t_worker_stream == &s) return false;
  const bool from_stream = t_worker_stream != nullptr;
  auto give_up = [&] {
    return s.stopping || s.abandoned || (from_stream && (s.blocked > 0 || s.inline_held > 0));
  };
  if (give_up()) return false;
  lock.unlock();
  {
    BlockedScope blocked;
    lock.lock();
    ++s.room_waiters;
    s.room_cv.wait(lock, [&] { return s.queue.size() <= s.resume_at || give_up(); });
    --s.room_waiters;
    lock.unlock();  // before the scope ends (lock order: the waiting stream's own first)
  }
  lock.lock();
  return true;
}

}  // namespace

// Runs fn on the calling thread, in stream order (MYDEV_LAUNCH_BLOCKING: a
// launch, copy or memset from a thread other than the stream's own worker).
// Handing each one to the worker and sleeping until it is done costs two thread
// wake-ups: the clone of a contiguous 64 KiB tensor (one device-to-device copy)
// took 13-23 us that way against 2.6-3.1 us on the CPU, and of a 4 KiB one
// 36-47 us against 1.3-1.5 us. A failure is reported by the call and is sticky
// too. Reported to activity tracing as `kind` (of `bytes`).
mydevError_t runSynchronously(const std::shared_ptr<S>& sp, mydevHostFn_t fn, void* user_data, const char* label,
                              mydevActivityKind kind, size_t bytes);

mydevError_t submitToStream(const std::shared_ptr<S>& sp, Task&& task) {
  S& s = *sp;
  if (__builtin_expect(s.capture_id.load(std::memory_order_relaxed) != 0, 0)) return captureTask(sp, std::move(task));
  // Waiting for its own stream from inside one of its tasks would deadlock.
  const bool blocking = config().launch_blocking && t_worker_stream != &s;
  // (Before the tracing below: runSynchronously traces what it runs itself.)
  if (blocking && (task.kind == Task::Kind::kCopy || task.kind == Task::Kind::kMemset)) {
    return runSynchronously(sp, runDataTask, &task, task.label, activityKindOf(task), task.count);
  }
  if (activityEnabled()) {
    task.traced = true;
    task.correlation = activityCorrelation();
  }
  BlockingWait wait;
  if (blocking) task.waiter = &wait;

  std::unique_lock<std::mutex> lock(s.mu);
  // Launch queue full: wait for room. Below the limit this is the only cost.
  while (s.queue.size() >= s.queue_limit && waitForRoom(s, lock)) {
  }
  if (s.abandoned || (!s.worker_started && g_exiting.load(std::memory_order_relaxed))) {
    lock.unlock();
    task.waiter = nullptr;
    return runInline(s, task);
  }
  if (s.stopping) return mydevErrorInvalidResourceHandle;  // destroyed meanwhile
  if (!ensureWorker(sp)) {
    lock.unlock();
    task.waiter = nullptr;
    return runInline(s, task);
  }
  EventMarker* record = task.kind == Task::Kind::kEventRecord ? task.marker.get() : nullptr;
  s.queue.push_back(std::move(task));
  s.enqueued.store(s.enqueued.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  if (record) {
    std::lock_guard<std::mutex> marker(record->mu);  // (lock order: stream, then marker)
    record->stream = sp;
    record->position = s.enqueued.load(std::memory_order_relaxed);
  }
  updateRunnable(s);
  const bool wake = s.worker_sleeping;
  s.worker_sleeping = false;  // one notify is enough
  if (!blocking) {
    lock.unlock();
    if (wake) s.work_cv.notify_one();
    return mydevSuccess;
  }
  if (wake) s.work_cv.notify_one();
  lock.unlock();
  {
    BlockedScope blocked;  // a worker enqueuing on another stream waits for it
    lock.lock();
    ++s.waiters;
    s.done_cv.wait(lock, [&] { return wait.done; });
    --s.waiters;
    lock.unlock();  // before the scope ends (lock order: the waiting stream's own first)
  }
  return wait.rc ? mydevErrorLaunchFailure : mydevSuccess;
}

// Completes a unit of the stream's work that ran on the calling thread, which
// the caller counted (enqueued incremented) and, if `held`, for which it held
// the worker (inline_held incremented).
void completeOnCaller(S& s, bool held) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (held) {
      wake = releaseHold(s);
    } else {
      updateRunnable(s);
    }
    s.completed.store(s.completed.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    notifyCompleted(s);
  }
  if (wake) s.work_cv.notify_all();  // let the worker go on
}

// Runs fn on the calling thread as the stream's current unit of work, which
// the caller counted (`counted`: enqueued incremented) and for which it holds
// the worker (`held`: inline_held incremented); completes both when fn returns.
// It is reported to activity tracing as `kind` (of `bytes`, for a copy or memset).
MYDEV_ALWAYS_INLINE mydevError_t runHeld(S& s, bool counted, bool held, mydevHostFn_t fn, void* user_data, const char* label,
                                         mydevActivityKind kind = mydevActivityKindKernel, size_t bytes = 0) {
  // Completes this unit and releases the worker when fn returns (or unwinds).
  struct Release {
    S& s;
    bool counted, held;
    S* saved_worker_stream;
    ~Release() {
      t_worker_stream = saved_worker_stream;
      if (counted) completeOnCaller(s, held);
    }
  } release{s, counted, held, t_worker_stream};
  // While fn runs this thread is "in" the stream, as its worker would be:
  // nested enqueues do not block and synchronising the stream does not wait
  // for fn itself.
  t_worker_stream = &s;
  const bool traced = activityEnabled();
  const uint64_t correlation = traced ? activityCorrelation() : 0;
  const int64_t start = traced ? activityClockNs() : 0;
  const int rc = callLaunched(s.device, fn, user_data);
  if (traced) emitActivity(s, kind, label, correlation, start, activityClockNs(), bytes, true);
  return rc ? mydevErrorLaunchFailure : mydevSuccess;
}

// Short tasks (mydevLaunchShortTask, and caller tasks): counts a unit of work
// and holds the stream's worker for the calling thread if the stream is idle,
// and reports whether it did. Handing a task to the worker moves the task, the
// stream's counters and its lock between two cores. On the 2-vCPU machines
// this was measured on, that cost varied between periods: the same loop of
// 1-element adds measured 1.3x CPU's time in one and 2.3x in another, while
// synchronous launches (no hand-off) stayed at 1.2x, and in a slow period the
// host-side stages of a launch took twice as long. Where the machine runs the
// two threads is not ours to choose; a short task on an idle stream costs less
// run here than its hand-off. Work already queued is never overtaken.
MYDEV_ALWAYS_INLINE bool holdIfIdle(S& s) {
  // (A hint without the lock; the locked check decides.)
  if (s.delay_us.load(std::memory_order_relaxed) != 0 ||
      s.completed.load(std::memory_order_acquire) != s.enqueued.load(std::memory_order_acquire)) {
    return false;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  const uint64_t before = s.enqueued.load(std::memory_order_relaxed);
  if (s.abandoned || s.stopping || s.inline_held > 0 || s.blocked > 0 || !s.queue.empty() ||
      s.completed.load(std::memory_order_relaxed) != before) {
    return false;
  }
  s.enqueued.store(before + 1, std::memory_order_release);
  ++s.inline_held;
  updateRunnable(s);
  return true;
}

// What the launch of a short task that failed on the calling thread returns.
// The failure is reported by the next synchronisation, as a queued task's is;
// under MYDEV_LAUNCH_BLOCKING by the launch, as every launch's is there.
mydevError_t callerTaskFailed(S& s, const char* label) {
  recordCallerFailure(s, label);
  return config().launch_blocking ? mydevErrorLaunchFailure : mydevSuccess;
}

// Runs a short task on the calling thread if the stream is idle (holdIfIdle),
// and reports whether it did.
MYDEV_ALWAYS_INLINE bool runIfIdle(S& s, mydevHostFn_t fn, void* user_data, const char* label, mydevError_t* rc) {
  if (!holdIfIdle(s)) return false;
  *rc = runHeld(s, /*counted=*/true, /*held=*/true, fn, user_data, label);
  if (*rc == mydevErrorLaunchFailure) *rc = callerTaskFailed(s, label);
  return true;
}

mydevError_t runInStreamOrder(const std::shared_ptr<S>& sp, mydevHostFn_t fn, void* user_data, const char* label,
                              mydevActivityKind kind, size_t bytes) {
  S& s = *sp;
  // Inside one of the stream's own tasks everything before is done already.
  if (t_worker_stream == &s) return callLaunched(s.device, fn, user_data) ? mydevErrorLaunchFailure : mydevSuccess;
  // Called from another stream's work, that stream now waits for this one.
  std::optional<BlockedScope> blocked;
  blocked.emplace();
  // Queued work is usually a few short kernels: waiting for it to drain by
  // spinning lets the idle path below take the stream without a gate handoff,
  // which costs two thread wake-ups. Only an optimisation: the locked check
  // decides. A host that may run the queue itself (drainUntil) does not wait.
  const bool may_drain = mayDrain(s);
  if (!may_drain || s.enqueued.load(std::memory_order_acquire) - s.completed.load(std::memory_order_acquire) < 2) {
    spinUntil(
        [&] { return s.completed.load(std::memory_order_acquire) == s.enqueued.load(std::memory_order_acquire); },
        kSyncSpinNs);
  }
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.abandoned && s.stopping) return mydevErrorInvalidResourceHandle;
  // counted: this call is one unit of the stream's work (enqueued now,
  // completed when fn returns); held: we hold the worker while fn runs.
  const bool counted = !s.abandoned;
  bool held = false;
  if (counted) {
    const uint64_t before = s.enqueued.load(std::memory_order_relaxed);
    s.enqueued.store(before + 1, std::memory_order_release);
    if (s.completed.load(std::memory_order_relaxed) == before) {
      ++s.inline_held;  // idle: hold the worker (if any) without a handoff
      updateRunnable(s);
      held = true;
    } else if (may_drain && drainUntil(s, lock, before)) {
      held = true;  // what came before has run here, and the stream is still held
    } else if (!ensureWorker(sp)) {
      // No worker to place a gate for (only other inline calls can be
      // pending then): wait for the stream to be idle and free.
      ++s.waiters;
      s.done_cv.wait(lock, [&] {
        return s.completed.load(std::memory_order_relaxed) == before && s.inline_held == 0;
      });
      --s.waiters;
      ++s.inline_held;
      updateRunnable(s);
      held = true;
    } else {
      // Work is pending: queue a gate and wait for the worker to reach it and hold.
      BlockingWait reached;
      Task gate;
      gate.kind = Task::Kind::kInlineGate;
      gate.waiter = &reached;
      s.queue.push_back(std::move(gate));
      updateRunnable(s);
      const bool wake = s.worker_sleeping;
      s.worker_sleeping = false;
      if (wake) s.work_cv.notify_one();
      // Not counted in s.waiters: the worker notifies when it reaches the gate
      // (or process exit drops it), so the tasks before it wake no one.
      s.done_cv.wait(lock, [&] { return reached.done; });
      held = reached.rc == 1;  // else process exit dropped the gate
    }
  }
  lock.unlock();
  blocked.reset();  // fn runs now: the calling stream is no longer waiting
  return runHeld(s, counted, held, fn, user_data, label, kind, bytes);
}

mydevError_t runSynchronously(const std::shared_ptr<S>& sp, mydevHostFn_t fn, void* user_data, const char* label,
                              mydevActivityKind kind, size_t bytes) {
  // The test delay stands for device time, which a synchronous launch waits out too.
  if (unsigned us = sp->delay_us.load(std::memory_order_relaxed)) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  const mydevError_t rc = runInStreamOrder(sp, fn, user_data, label, kind, bytes);
  if (rc == mydevErrorLaunchFailure) recordCallerFailure(*sp, label);
  return rc;
}

mydevError_t synchronizeDevice(int device) {
  std::vector<std::shared_ptr<S>> streams = deviceStreams(device);
  for (const auto& s : streams) waitIdle(*s);
  // One failure reported, the others left for later synchronisations.
  for (const auto& s : streams) {
    if (mydevError_t e = takeStickyError(*s)) return e;
  }
  return mydevSuccess;
}

void waitDeviceIdle(int device) {
  // Every synchronous copy (a tensor's .item(), a print) waits here, mostly
  // for a device with nothing queued: that is checked in place first, without
  // a list of the device's streams and a reference to each.
  StreamTable& t = table();
  auto idle = [](const S& s) {
    return s.completed.load(std::memory_order_acquire) >= s.enqueued.load(std::memory_order_acquire);
  };
  if (idle(*t.defaults[static_cast<size_t>(device)])) {
    std::lock_guard<std::mutex> lock(t.mu);
    bool all_idle = true;
    for (const auto& [handle, s] : t.live) {
      if (s->device == device && !idle(*s)) {
        all_idle = false;
        break;
      }
    }
    if (all_idle) return;
  }
  for (const auto& s : deviceStreams(device)) waitIdle(*s);
}

}  // namespace mydev_detail

using namespace mydev_detail;

namespace {

// The stream a handle names, for calls made on every launch. A default stream
// lives as long as the process, so one (most launches) is reached without a
// reference: two atomic operations on a count the worker's shared_ptr shares.
class StreamRef {
 public:
  mydevError_t resolve(mydevStream_t handle) {
    if (!handle) {
      stream_ = &table().defaults[static_cast<size_t>(currentDevice())];
    } else if (!(stream_ = defaultStreamOf(handle))) {
      if (mydevError_t e = resolveStream(handle, &user_)) return e;
      stream_ = &user_;
    }
    return mydevSuccess;
  }
  const std::shared_ptr<S>& get() const { return *stream_; }
  // The reference to a user stream that resolve() took (empty for a default stream).
  std::shared_ptr<S> take_reference() { return std::move(user_); }

 private:
  std::shared_ptr<S> user_;
  const std::shared_ptr<S>* stream_ = nullptr;
};

mydevError_t launch(mydevStream_t stream, mydevHostFn_t fn, void* user_data, const char* label,
                    unsigned int flags = 0) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!fn) return mydevErrorInvalidValue;
  StreamRef ref;
  if (mydevError_t e = ref.resolve(stream)) return e;
  const std::shared_ptr<S>& s = ref.get();
  const bool capturing = __builtin_expect(s->capture_id.load(std::memory_order_relaxed) != 0, 0);
  if (capturing && (flags & mydevLaunchIdleOnly)) return mydevErrorNotReady;  // nothing runs while capturing
  // A short task on an idle stream runs at the call in both modes: under
  // MYDEV_LAUNCH_BLOCKING this is runInStreamOrder's idle case, without its
  // spin and blocked-stream bookkeeping.
  if ((flags & mydevLaunchShortTask) && t_worker_stream != s.get() && !capturing) {
    mydevError_t rc;
    if (runIfIdle(*s, fn, user_data, label, &rc)) return rc;
  }
  if (config().launch_blocking && t_worker_stream != s.get() && !capturing) {
    return runSynchronously(s, fn, user_data, label, mydevActivityKindKernel, 0);
  }
  if (flags & mydevLaunchIdleOnly) return mydevErrorNotReady;
  Task task;
  task.kind = Task::Kind::kLaunch;
  task.fn = fn;
  task.ptr = user_data;
  if (label) {
    size_t n = strnlen(label, sizeof(task.label) - 1);
    std::memcpy(task.label, label, n);
    task.label[n] = '\0';
  }
  return submitToStream(s, std::move(task));
}

}  // namespace

extern "C" {

mydevError_t mydevDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!least && !greatest) return mydevErrorInvalidValue;
  if (least) *least = kLeastPriority;
  if (greatest) *greatest = kGreatestPriority;
  return mydevSuccess;
}

mydevError_t mydevStreamCreateWithPriority(mydevStream_t* stream, int priority) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!stream) return mydevErrorInvalidValue;
  // Out-of-range priorities are clamped, as CUDA does, so callers can ask for
  // "highest" without querying the range first.
  if (priority > kLeastPriority) priority = kLeastPriority;
  if (priority < kGreatestPriority) priority = kGreatestPriority;
  StreamTable& t = table();
  auto s = std::make_shared<S>();
  s->device = currentDevice();
  s->priority = priority;
  s->id = t.next_id.fetch_add(1);
  std::lock_guard<std::mutex> lock(t.mu);
  t.live.emplace(s.get(), s);
  *stream = s.get();
  return mydevSuccess;
}

mydevError_t mydevStreamDestroy(mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  // NULL means the default stream, which belongs to the runtime.
  if (!stream) return mydevErrorInvalidResourceHandle;
  StreamTable& t = table();
  std::shared_ptr<S> s;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.live.find(stream);
    if (it == t.live.end()) return mydevErrorInvalidResourceHandle;
    s = std::move(it->second);
    t.live.erase(it);
  }
  // From here new submissions fail; queued work still runs, then the worker
  // leaves. Its pending sticky error, if any, is dropped with the stream.
  std::unique_lock<std::mutex> lock(s->mu);
  s->stopping = true;
  s->work_cv.notify_all();
  s->room_cv.notify_all();  // submitters waiting for room fail now rather than at the drain
  if (!s->worker_started) return mydevSuccess;
  if (t_worker_stream == s.get()) {
    // Destroyed from one of its own tasks: the worker (which holds its own
    // reference) drains the queue after this task and exits on its own.
    if (s->worker.joinable()) s->worker.detach();
    return mydevSuccess;
  }
  lock.unlock();
  BlockedScope blocked;  // destroyed from another stream's work: that stream waits
  lock.lock();
  ++s->waiters;
  s->done_cv.wait(lock, [&] { return s->worker_exited; });
  --s->waiters;
  std::thread worker = std::move(s->worker);  // empty if process exit took it
  lock.unlock();
  if (worker.joinable()) worker.join();
  return mydevSuccess;
}

mydevError_t mydevDeviceGetDefaultStream(int device, mydevStream_t* stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!stream) return mydevErrorInvalidValue;
  if (!validDevice(device)) return mydevErrorInvalidDevice;
  *stream = table().defaults[static_cast<size_t>(device)].get();
  return mydevSuccess;
}

mydevError_t mydevStreamGetDevice(mydevStream_t stream, int* device) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!device) return mydevErrorInvalidValue;
  std::shared_ptr<S> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  *device = s->device;
  return mydevSuccess;
}

mydevError_t mydevStreamGetPriority(mydevStream_t stream, int* priority) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!priority) return mydevErrorInvalidValue;
  std::shared_ptr<S> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  *priority = s->priority;
  return mydevSuccess;
}

mydevError_t mydevStreamSynchronize(mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<S> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  if (streamCaptureId(*s) != 0 && !onStreamWorker()) return refuseCapturedWait(*s);
  return synchronizeStream(*s);
}

mydevError_t mydevStreamQuery(mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  StreamRef ref;  // as launch()
  if (mydevError_t e = ref.resolve(stream)) return e;
  const S& s = *ref.get();
  // completed is read first: both only grow, so this never reports a stream
  // idle while something enqueued before the call is unfinished.
  uint64_t done = s.completed.load(std::memory_order_acquire);
  uint64_t queued = s.enqueued.load(std::memory_order_acquire);
  return done < queued ? mydevErrorNotReady : mydevSuccess;
}

mydevError_t mydevLaunchHostFunc(mydevStream_t stream, mydevHostFn_t fn, void* user_data) {
  return launch(stream, fn, user_data, nullptr);
}

mydevError_t mydevLaunchHostFuncLabeled(mydevStream_t stream, mydevHostFn_t fn, void* user_data,
                                        const char* label) {
  return launch(stream, fn, user_data, label);
}

mydevError_t mydevLaunchHostFuncEx(mydevStream_t stream, mydevHostFn_t fn, void* user_data, const char* label,
                                   unsigned int flags) {
  return launch(stream, fn, user_data, label, flags);
}

namespace {
// What a mydevCallerTask holds between its begin and end.
struct CallerTask {
  std::shared_ptr<S> keep_alive;  // a user stream's reference; a default stream lives as long as the process
  S* stream;
  S* saved_worker_stream;
  int saved_device;
  bool traced;
  uint64_t correlation;
  int64_t start;
};
static_assert(sizeof(CallerTask) <= sizeof(mydevCallerTask) && alignof(CallerTask) <= alignof(mydevCallerTask),
              "mydevCallerTask is too small for CallerTask");
}  // namespace

mydevError_t mydevStreamBeginCallerTask(mydevStream_t stream, mydevCallerTask* task) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!task) return mydevErrorInvalidValue;
  StreamRef ref;
  if (mydevError_t e = ref.resolve(stream)) return e;
  S& s = *ref.get();
  // From the stream's own work, it is not idle (it is running that work);
  // while it captures, nothing runs.
  if (t_worker_stream == &s || s.capture_id.load(std::memory_order_relaxed) != 0 || !holdIfIdle(s)) {
    return mydevErrorNotReady;
  }
  const bool traced = activityEnabled();
  new (task->opaque) CallerTask{ref.take_reference(), &s,
                                t_worker_stream, currentDevice(),
                                traced, traced ? activityCorrelation() : 0,
                                traced ? activityClockNs() : 0};
  // As for a launched function: the calling thread is "in" the stream, on its device.
  t_worker_stream = &s;
  setCurrentDevice(s.device);
  return mydevSuccess;
}

mydevError_t mydevStreamEndCallerTask(mydevCallerTask* task, int failed, const char* label) {
  if (!task) return mydevErrorInvalidValue;
  CallerTask* c = std::launder(reinterpret_cast<CallerTask*>(task->opaque));
  S& s = *c->stream;
  if (c->traced) emitActivity(s, mydevActivityKindKernel, label, c->correlation, c->start, activityClockNs(), 0, true);
  setCurrentDevice(c->saved_device);
  t_worker_stream = c->saved_worker_stream;
  completeOnCaller(s, /*held=*/true);
  const mydevError_t rc = failed ? callerTaskFailed(s, label) : mydevSuccess;
  c->~CallerTask();
  return rc;
}

mydevError_t mydevLaunchHostFuncInline(mydevStream_t stream, mydevHostFn_t fn, void* user_data) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!fn) return mydevErrorInvalidValue;
  std::shared_ptr<S> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  if (streamCaptureId(*s) != 0 && t_worker_stream != s.get()) return refuseCapturedWait(*s);
  return runInStreamOrder(s, fn, user_data, nullptr, mydevActivityKindKernel, 0);
}

mydevError_t mydevStreamGetErrorLabel(mydevStream_t stream, char* buf, size_t len) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!buf || len == 0) return mydevErrorInvalidValue;
  std::shared_ptr<S> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  std::lock_guard<std::mutex> lock(s->mu);
  size_t n = s->error_label.size() < len - 1 ? s->error_label.size() : len - 1;
  std::memcpy(buf, s->error_label.data(), n);
  buf[n] = '\0';
  return mydevSuccess;
}

mydevError_t mydevTestSetStreamDelay(mydevStream_t stream, unsigned microseconds) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<S> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  s->delay_us.store(microseconds, std::memory_order_relaxed);
  return mydevSuccess;
}

}  // extern "C"
