// Events: markers recorded into a stream, completing when the stream reaches
// them. Completion is stamped with steady_clock when the marker executes, so
// elapsed times measure stream progress rather than when Record was called
// (the same thing today, since streams run inline).
#include "internal.h"

#include <chrono>
#include <unordered_map>

struct mydevEvent_st {
  unsigned flags;
  std::mutex mu;
  bool recorded = false;
  bool complete = false;
  int64_t completed_ns = 0;
  int device = -1;  // of the stream it was last recorded on; for cross-device waits once async
};

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

struct EventState {
  bool timing;
  bool recorded;
  bool complete;
  int64_t completed_ns;
};

EventState snapshot(mydevEvent_st& e) {
  std::lock_guard<std::mutex> lock(e.mu);
  return EventState{!(e.flags & mydevEventDisableTiming), e.recorded, e.complete, e.completed_ns};
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
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
  {
    // Re-recording replaces the previous marker: incomplete until reached.
    std::lock_guard<std::mutex> lock(ev->mu);
    ev->recorded = true;
    ev->complete = false;
    ev->device = streamDevice(*s);
  }
  return submitToStream(*s, [ev] {
    std::lock_guard<std::mutex> lock(ev->mu);
    ev->completed_ns = nowNs();
    ev->complete = true;
    return 0;
  });
}

mydevError_t mydevEventQuery(mydevEvent_t event) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<mydevEvent_st> ev;
  if (mydevError_t e = resolveEvent(event, &ev)) return e;
  EventState st = snapshot(*ev);
  // A never-recorded event counts as complete, as in CUDA.
  return (!st.recorded || st.complete) ? mydevSuccess : mydevErrorNotReady;
}

mydevError_t mydevEventSynchronize(mydevEvent_t event) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<mydevEvent_st> ev;
  if (mydevError_t e = resolveEvent(event, &ev)) return e;
  // Waiting for completion would go here; inline streams complete at record.
  return mydevSuccess;
}

mydevError_t mydevEventElapsedTime(float* ms, mydevEvent_t start, mydevEvent_t end) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!ms) return mydevErrorInvalidValue;
  std::shared_ptr<mydevEvent_st> a, b;
  if (mydevError_t e = resolveEvent(start, &a)) return e;
  if (mydevError_t e = resolveEvent(end, &b)) return e;
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
  // Inline execution means everything the event marks has already run, so
  // there is nothing to order. An async version enqueues a wait here.
  return mydevSuccess;
}

}  // extern "C"
