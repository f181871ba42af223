// Copies and memset. Arguments are validated against the allocation registry
// when the call is made, before anything moves, so a bad copy fails whole (and
// at once) instead of half-done or crashing on an unmapped page. Async copies
// then run on the stream's worker; freeing their memory before they ran is, as
// in CUDA, the caller's bug. Device ranges are named by device address and
// moved through their kernel addresses (identical outside strict mode), which
// validation returns, so async tasks carry kernel addresses.
#include "internal.h"

#include <cstring>

using namespace mydev_detail;

namespace {

// devices[0]/[1] receive the devices of the destination/source when they are
// device memory (left alone otherwise). *kdst/*ksrc receive the addresses the
// copy itself uses: the kernel address of a device range (see memory.cpp),
// the pointer itself for a host range.
mydevError_t validateCopy(void* dst, const void* src, size_t count, mydevMemcpyKind kind,
                          int devices[2], void** kdst, const void** ksrc) {
  *kdst = dst;
  *ksrc = src;
  void* src_kernel = const_cast<void*>(src);
  mydevError_t e = mydevErrorInvalidValue;
  switch (kind) {
    case mydevMemcpyHostToDevice:
      e = validateRanges({{dst, count, true, &devices[0], kdst}, {src, count, false}});
      break;
    case mydevMemcpyDeviceToHost:
      e = validateRanges({{dst, count, false}, {src, count, true, &devices[1], &src_kernel}});
      break;
    case mydevMemcpyDeviceToDevice:
      e = validateRanges({{dst, count, true, &devices[0], kdst}, {src, count, true, &devices[1], &src_kernel}});
      break;
  }
  *ksrc = src_kernel;
  return e;
}

bool validKind(mydevMemcpyKind kind) {
  return kind == mydevMemcpyHostToDevice || kind == mydevMemcpyDeviceToHost ||
         kind == mydevMemcpyDeviceToDevice;
}

}  // namespace

extern "C" {

// Ordered like CUDA's legacy default stream, simplified: it first waits for
// all work already enqueued on every stream of the current device and of the
// devices holding the two ranges, then copies in the calling thread. Copy
// errors are returned directly; sticky launch errors are left for the next
// synchronisation. Inside a launched function (on a stream worker) it copies
// at once: waiting there could wait for the calling stream itself.
namespace {
// The label of a copy's activity record (mydev_activity.h).
const char* copyLabel(mydevMemcpyKind kind) {
  switch (kind) {
    case mydevMemcpyHostToDevice: return "HtoD";
    case mydevMemcpyDeviceToHost: return "DtoH";
    case mydevMemcpyDeviceToDevice: return "DtoD";
  }
  return "";
}
}  // namespace

mydevError_t mydevMemcpy(void* dst, const void* src, size_t count, mydevMemcpyKind kind) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!validKind(kind)) return mydevErrorInvalidValue;
  if (count == 0) return mydevSuccess;
  int devices[2] = {-1, -1};
  void* kdst;
  const void* ksrc;
  if (mydevError_t e = validateCopy(dst, src, count, kind, devices, &kdst, &ksrc)) return e;
  if (!onStreamWorker()) {
    const int current = currentDevice();
    for (int d : {current, devices[0], devices[1]}) {
      if (d >= 0) {
        if (mydevError_t e = checkDeviceWait(d)) return e;
      }
    }
    waitDeviceIdle(current);
    for (int i = 0; i < 2; ++i) {
      int d = devices[i];
      if (d >= 0 && d != current && (i == 0 || d != devices[0])) waitDeviceIdle(d);
    }
  }
  // A synchronous copy from the host is traced as work of the device's
  // default stream, which it waited for (inside a stream's task it is part
  // of that task).
  const bool traced = activityEnabled() && !onStreamWorker();
  const int64_t start = traced ? activityClockNs() : 0;
  // memmove: a device-to-device copy within one allocation may overlap.
  std::memmove(kdst, ksrc, count);
  if (traced) {
    mydevActivityRecord r{};
    r.kind = mydevActivityKindMemcpy;
    r.device = devices[0] >= 0 ? devices[0] : devices[1];
    r.stream = nullptr;
    r.label = copyLabel(kind);
    r.correlation_id = activityCorrelation();
    r.start_ns = start;
    r.end_ns = activityClockNs();
    r.bytes = count;
    r.inline_launch = 1;
    activityEmit(r);
  }
  return mydevSuccess;
}

mydevError_t mydevMemcpyAsync(void* dst, const void* src, size_t count, mydevMemcpyKind kind,
                              mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!validKind(kind)) return mydevErrorInvalidValue;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  if (count == 0) return mydevSuccess;
  int devices[2] = {-1, -1};
  void* kdst;
  const void* ksrc;
  if (mydevError_t e = validateCopy(dst, src, count, kind, devices, &kdst, &ksrc)) return e;
  Task task;
  task.kind = Task::Kind::kCopy;
  task.ptr = kdst;
  task.src = ksrc;
  task.count = count;
  std::strcpy(task.label, copyLabel(kind));
  return submitToStream(s, std::move(task));
}

mydevError_t mydevMemsetAsync(void* dst, int value, size_t count, mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  if (count == 0) return mydevSuccess;
  void* kdst = dst;
  if (mydevError_t e = validateRanges({{dst, count, true, nullptr, &kdst}})) return e;
  Task task;
  task.kind = Task::Kind::kMemset;
  task.ptr = kdst;
  task.value = value;
  task.count = count;
  return submitToStream(s, std::move(task));
}

}  // extern "C"
