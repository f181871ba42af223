// Streams: ordered queues of device work, each on one device.
//
// This version executes work inline, in the submitting thread, before the
// submitting call returns. The state below (pending count, sticky error) is
// what a worker-thread implementation needs too, so the API and its error
// reporting already behave as they will when execution becomes asynchronous.
#include "internal.h"

#include <atomic>
#include <unordered_map>
#include <vector>

struct mydevStream_st {
  int device;
  int priority;
  uint64_t id;
  std::mutex mu;
  // Work submitted and not yet finished. Always 0 while execution is inline.
  uint64_t pending = 0;
  // First launch failure since the last synchronisation, reported once by it.
  mydevError_t sticky_error = mydevSuccess;
};

namespace mydev_detail {
namespace {

constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -1;

struct StreamTable {
  std::mutex mu;
  std::unordered_map<mydevStream_st*, std::shared_ptr<mydevStream_st>> live;  // user-created
  std::vector<std::shared_ptr<mydevStream_st>> defaults;                     // one per device
  std::atomic<uint64_t> next_id{1};                                          // 0: default streams
};

// Leaked on purpose, for the same exit-order reason as the memory registry.
StreamTable& table() {
  static StreamTable* t = [] {
    auto* st = new StreamTable();
    for (int d = 0; d < config().device_count; ++d) {
      auto s = std::make_shared<mydevStream_st>();
      s->device = d;
      s->priority = kLeastPriority;
      s->id = 0;
      st->defaults.push_back(std::move(s));
    }
    return st;
  }();
  return *t;
}

mydevError_t takeStickyError(mydevStream_st& s) {
  std::lock_guard<std::mutex> lock(s.mu);
  mydevError_t e = s.sticky_error;
  s.sticky_error = mydevSuccess;
  return e;
}

// Waiting for pending work would go here; inline execution leaves none.
mydevError_t synchronizeStream(mydevStream_st& s) { return takeStickyError(s); }

}  // namespace

void initDefaultStreams() { (void)table(); }

mydevError_t resolveStream(mydevStream_t handle, std::shared_ptr<mydevStream_st>* out) {
  StreamTable& t = table();
  if (!handle) {
    *out = t.defaults[static_cast<size_t>(currentDevice())];
    return mydevSuccess;
  }
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.live.find(handle);
  if (it == t.live.end()) return mydevErrorInvalidResourceHandle;
  *out = it->second;
  return mydevSuccess;
}

int streamDevice(const mydevStream_st& stream) { return stream.device; }

mydevError_t submitToStream(mydevStream_st& s, const std::function<int()>& work) {
  if (work() == 0) return mydevSuccess;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.sticky_error == mydevSuccess) s.sticky_error = mydevErrorLaunchFailure;
  return mydevErrorLaunchFailure;
}

mydevError_t synchronizeDevice(int device) {
  StreamTable& t = table();
  std::vector<std::shared_ptr<mydevStream_st>> streams{t.defaults[static_cast<size_t>(device)]};
  {
    std::lock_guard<std::mutex> lock(t.mu);
    for (const auto& [handle, s] : t.live) {
      if (s->device == device) streams.push_back(s);
    }
  }
  // Every stream is synchronised (and its sticky error cleared) even after
  // the first failure, so one DeviceSynchronize reports a failure once.
  mydevError_t first = mydevSuccess;
  for (const auto& s : streams) {
    mydevError_t e = synchronizeStream(*s);
    if (first == mydevSuccess) first = e;
  }
  return first;
}

}  // namespace mydev_detail

using namespace mydev_detail;

namespace {

// Restores the caller's current device after a launched function, which runs
// "on" its stream's device as a kernel would.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : saved_(currentDevice()) { setCurrentDevice(device); }
  ~DeviceGuard() { setCurrentDevice(saved_); }

 private:
  int saved_;
};

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
  auto s = std::make_shared<mydevStream_st>();
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
  std::lock_guard<std::mutex> lock(t.mu);
  // Pending work (none while inline) would finish first: submitters hold
  // their own references, so erasing the handle does not free it under them.
  return t.live.erase(stream) ? mydevSuccess : mydevErrorInvalidResourceHandle;
}

mydevError_t mydevStreamGetDevice(mydevStream_t stream, int* device) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!device) return mydevErrorInvalidValue;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  *device = s->device;
  return mydevSuccess;
}

mydevError_t mydevStreamGetPriority(mydevStream_t stream, int* priority) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!priority) return mydevErrorInvalidValue;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  *priority = s->priority;
  return mydevSuccess;
}

mydevError_t mydevStreamSynchronize(mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  return synchronizeStream(*s);
}

mydevError_t mydevStreamQuery(mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  std::lock_guard<std::mutex> lock(s->mu);
  return s->pending ? mydevErrorNotReady : mydevSuccess;
}

mydevError_t mydevLaunchHostFunc(mydevStream_t stream, mydevHostFn_t fn, void* user_data) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!fn) return mydevErrorInvalidValue;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  int device = s->device;
  return submitToStream(*s, [=] {
    DeviceGuard guard(device);
    AccessWindow window;
    return fn(user_data);
  });
}

}  // extern "C"
