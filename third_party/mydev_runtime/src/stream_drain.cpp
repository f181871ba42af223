// Hosts that wait for a stream run its queued work themselves; synchronising a
// stream; process exit, which drops queued work and joins the workers.
#include "stream_state.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace mydev_detail {

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

}  // namespace mydev_detail
