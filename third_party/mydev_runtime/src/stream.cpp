// Streams: ordered queues of device work, each on one device, each executed by
// its own worker thread. This file: streams and their table, submission, work
// run on the calling thread, and the C API; the worker is stream_worker.cpp's,
// hosts that wait and process exit stream_drain.cpp's, the shared state
// stream_state.h's.
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
#include "stream_state.h"

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

// Puts an entry on s's queue, counted in `pushed` (what an idle worker spins
// on). Caller holds s.mu.
void pushEntry(S& s, Task&& entry) {
  s.queue.push_back(std::move(entry));
  s.pushed.store(s.pushed.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

// Whether the caller, having queued work, must wake the worker (it sleeps):
// one notify is enough, so the next caller need not. Caller holds s.mu.
bool takeWorkerWake(S& s) {
  const bool wake = s.worker_sleeping;
  s.worker_sleeping = false;
  s.worker_wakes += wake;
  return wake;
}

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
  pushEntry(s, std::move(task));
  s.enqueued.store(s.enqueued.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  if (record) {
    std::lock_guard<std::mutex> marker(record->mu);  // (lock order: stream, then marker)
    record->stream = sp;
    record->position = s.enqueued.load(std::memory_order_relaxed);
  }
  updateRunnable(s);
  const bool wake = takeWorkerWake(s);
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
      pushEntry(s, std::move(gate));
      updateRunnable(s);
      const bool wake = takeWorkerWake(s);
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

// TEST ONLY, for the runtime's own tests (declared in tests/helpers.h, not in
// a public header): how many launches onto the stream had to wake its worker.
MYDEV_API mydevError_t mydevTestGetStreamWorkerWakes(mydevStream_t stream, unsigned long long* wakes) {
  if (wakes == nullptr) return mydevErrorInvalidValue;
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<S> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  std::lock_guard<std::mutex> lock(s->mu);
  *wakes = s->worker_wakes;
  return mydevSuccess;
}

}  // extern "C"
