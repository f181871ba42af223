// Events: markers recorded into a stream, completing when the stream's worker
// reaches them. Completion is stamped with steady_clock at that moment, so
// elapsed times measure stream progress rather than when Record was called.
//
// Each record is a fresh EventMarker (see internal.h): the event points at its
// latest one, and waits capture the marker current at their call, so a later
// re-record never changes what an earlier wait is waiting for.
#include "internal.h"

#include <chrono>
#include <unordered_map>

struct mydevEvent_st {
  unsigned flags;
  std::mutex mu;
  std::shared_ptr<mydev_detail::EventMarker> last;  // latest record; null until recorded
  int device = -1;  // of the stream it was last recorded on
};

namespace mydev_detail {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void completeMarker(EventMarker& m) {
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.completed_ns = nowNs();
    m.done = true;
  }
  // The notifier holds a reference to m (through its task), so m outlives this.
  m.cv.notify_all();
}

void waitMarker(EventMarker& m) {
  std::unique_lock<std::mutex> lock(m.mu);
  if (m.done) return;
  lock.unlock();
  // A stream waiting for an event must not hold back the lower-priority
  // stream that may be the one to record it.
  BlockedScope blocked;
  lock.lock();
  m.cv.wait(lock, [&] { return m.done; });
}

}  // namespace mydev_detail

using namespace mydev_detail;

namespace {

struct EventTable {
  std::mutex mu;
  std::unordered_map<mydevEvent_st*, std::shared_ptr<mydevEvent_st>> live;
};

// Leaked on purpose, for the same exit-order reason as the memory registry.
EventTable& table() {
  static EventTable* t = new EventTable();
  return *t;
}

mydevError_t resolveEvent(mydevEvent_t handle, std::shared_ptr<mydevEvent_st>* out) {
  if (!handle) return mydevErrorInvalidResourceHandle;
  EventTable& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.live.find(handle);
  if (it == t.live.end()) return mydevErrorInvalidResourceHandle;
  *out = it->second;
  return mydevSuccess;
}

std::shared_ptr<EventMarker> currentMarker(mydevEvent_st& e) {
  std::lock_guard<std::mutex> lock(e.mu);
  return e.last;
}

bool capturedMarker(EventMarker& m) {
  std::lock_guard<std::mutex> lock(m.mu);
  return m.capture_id != 0;
}

struct EventState {
  bool timing;
  bool recorded;
  bool complete;
  int64_t completed_ns;
};

EventState snapshot(mydevEvent_st& e) {
  EventState st{!(e.flags & mydevEventDisableTiming), false, false, 0};
  std::shared_ptr<EventMarker> m = currentMarker(e);
  if (m) {
    std::lock_guard<std::mutex> lock(m->mu);
    st.recorded = true;
    st.complete = m->done;
    st.completed_ns = m->completed_ns;
  }
  return st;
}

}  // namespace

extern "C" {

mydevError_t mydevEventCreateWithFlags(mydevEvent_t* event, unsigned int flags) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!event) return mydevErrorInvalidValue;
  if (flags & ~static_cast<unsigned>(mydevEventDisableTiming)) return mydevErrorInvalidValue;
  auto ev = std::make_shared<mydevEvent_st>();
  ev->flags = flags;
  EventTable& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.live.emplace(ev.get(), ev);
  *event = ev.get();
  return mydevSuccess;
}

mydevError_t mydevEventDestroy(mydevEvent_t event) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!event) return mydevErrorInvalidResourceHandle;
  EventTable& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.live.erase(event) ? mydevSuccess : mydevErrorInvalidResourceHandle;
}

mydevError_t mydevEventRecord(mydevEvent_t event, mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<mydevEvent_st> ev;
  if (mydevError_t e = resolveEvent(event, &ev)) return e;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  // Re-recording replaces the previous marker: incomplete until reached.
  auto marker = std::make_shared<EventMarker>();
  std::shared_ptr<EventMarker> previous;
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    previous = std::move(ev->last);
    ev->last = marker;
    ev->device = streamDevice(*s);
  }
  Task task;
  task.kind = Task::Kind::kEventRecord;
  task.marker = marker;
  mydevError_t err = submitToStream(s, std::move(task));
  if (err == mydevErrorInvalidResourceHandle) {
    // The stream was destroyed meanwhile and the marker will never run: undo,
    // so nothing waits for it forever.
    std::lock_guard<std::mutex> lock(ev->mu);
    if (ev->last == marker) ev->last = std::move(previous);
  }
  return err;
}

mydevError_t mydevEventQuery(mydevEvent_t event) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<mydevEvent_st> ev;
  if (mydevError_t e = resolveEvent(event, &ev)) return e;
  if (std::shared_ptr<EventMarker> m = currentMarker(*ev); m && capturedMarker(*m)) return refuseCapturedEvent(*m);
  EventState st = snapshot(*ev);
  // A never-recorded event counts as complete, as in CUDA.
  return (!st.recorded || st.complete) ? mydevSuccess : mydevErrorNotReady;
}

mydevError_t mydevEventSynchronize(mydevEvent_t event) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<mydevEvent_st> ev;
  if (mydevError_t e = resolveEvent(event, &ev)) return e;
  // Waits for the record current at this call; never recorded: nothing to wait for.
  if (std::shared_ptr<EventMarker> m = currentMarker(*ev)) {
    if (capturedMarker(*m)) return refuseCapturedEvent(*m);
    drainToRecord(*m);
    waitMarker(*m);
  }
  return mydevSuccess;
}

mydevError_t mydevEventElapsedTime(float* ms, mydevEvent_t start, mydevEvent_t end) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!ms) return mydevErrorInvalidValue;
  std::shared_ptr<mydevEvent_st> a, b;
  if (mydevError_t e = resolveEvent(start, &a)) return e;
  if (mydevError_t e = resolveEvent(end, &b)) return e;
  for (const auto* e : {&a, &b}) {
    std::shared_ptr<EventMarker> m = currentMarker(**e);
    if (m && capturedMarker(*m)) return mydevErrorCapturedEvent;
  }
  // Snapshot one at a time: start and end may be the same event.
  EventState sa = snapshot(*a);
  EventState sb = snapshot(*b);
  if (!sa.timing || !sb.timing) return mydevErrorTimingDisabled;
  if (!sa.recorded || !sb.recorded) return mydevErrorInvalidResourceHandle;
  if (!sa.complete || !sb.complete) return mydevErrorNotReady;
  *ms = static_cast<float>(static_cast<double>(sb.completed_ns - sa.completed_ns) / 1e6);
  return mydevSuccess;
}

mydevError_t mydevStreamWaitEvent(mydevStream_t stream, mydevEvent_t event) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  std::shared_ptr<mydevEvent_st> ev;
  if (mydevError_t e = resolveEvent(event, &ev)) return e;
  std::shared_ptr<EventMarker> m = currentMarker(*ev);
  if (!m) return mydevSuccess;  // never recorded: nothing to wait for
  if (capturedMarker(*m) || streamCaptureId(*s) != 0) return captureWait(s, m);
  {
    std::lock_guard<std::mutex> lock(m->mu);
    if (m->done) return mydevSuccess;  // already reached: nothing to order
  }
  // Later work on `stream` waits, on its worker, for this record (not any later one).
  Task task;
  task.kind = Task::Kind::kEventWait;
  task.marker = std::move(m);
  return submitToStream(s, std::move(task));
}

}  // extern "C"
