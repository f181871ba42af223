// A stream's worker thread and what it runs: tasks in FIFO order, failures
// recorded for the next synchronisation, and the priority scheduler that holds
// a worker back while a stream of higher priority on its device is runnable
// (stream.cpp's opening comment has the whole picture).
#include "stream_state.h"

#include <cxxabi.h>
#include <pthread.h>

#include <chrono>
#include <cstdio>
#include <cstring>

namespace mydev_detail {

namespace {
int priorityLevel(int priority) { return priority - kGreatestPriority; }
}  // namespace

DeviceSchedule& schedule(const S& s) { return table().schedule[static_cast<size_t>(s.device)]; }

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
  // The test delay is served once per task: this holds the `completed` count at
  // which the front task's delay ended. A flag instead outlived its task when a
  // synchronising host drained the queue during the delay (the delay was set to
  // 0 first), and the next delayed stream's first task then ran at once.
  uint64_t delay_served_at = ~uint64_t{0};
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
      // (On `pushed`, not `enqueued`: a short kernel a host runs at the call
      // counts in `enqueued`, and ended the spin, so the worker slept through
      // decoding's gaps and nearly every queued launch paid a futex wake.)
      const uint64_t seen = s.pushed.load(std::memory_order_relaxed);
      lock.unlock();
      spinUntil([&] { return s.pushed.load(std::memory_order_acquire) != seen; }, kWorkerSpinNs);
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
    const uint64_t front = s.completed.load(std::memory_order_relaxed);
    if (unsigned delay = delay_served_at == front ? 0 : s.delay_us.load(std::memory_order_relaxed)) {
      // Test hook. Interruptible by process exit, which drops the queue. Served
      // only if the same task is still at the front (no host ran it meanwhile).
      s.work_cv.wait_for(lock, std::chrono::microseconds(delay), [&] { return s.abandoned; });
      if (s.completed.load(std::memory_order_relaxed) == front) delay_served_at = front;
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
}  // namespace mydev_detail
