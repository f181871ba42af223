// Copies and memset. Arguments are validated against the allocation registry
// before anything moves, so a bad copy fails whole instead of half-done (or
// crashing on an unmapped page).
#include "internal.h"

#include <cstring>

using namespace mydev_detail;

namespace {

mydevError_t validateCopy(void* dst, const void* src, size_t count, mydevMemcpyKind kind) {
  switch (kind) {
    case mydevMemcpyHostToDevice:
      return validateRanges({{dst, count, true}, {src, count, false}});
    case mydevMemcpyDeviceToHost:
      return validateRanges({{dst, count, false}, {src, count, true}});
    case mydevMemcpyDeviceToDevice:
      return validateRanges({{dst, count, true}, {src, count, true}});
  }
  return mydevErrorInvalidValue;
}

bool validKind(mydevMemcpyKind kind) {
  return kind == mydevMemcpyHostToDevice || kind == mydevMemcpyDeviceToHost ||
         kind == mydevMemcpyDeviceToDevice;
}

mydevError_t copyOnStream(void* dst, const void* src, size_t count, mydevMemcpyKind kind,
                          mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!validKind(kind)) return mydevErrorInvalidValue;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  if (count == 0) return mydevSuccess;
  if (mydevError_t e = validateCopy(dst, src, count, kind)) return e;
  return submitToStream(*s, [=] {
    AccessWindow window;
    // memmove: a device-to-device copy within one allocation may overlap.
    std::memmove(dst, src, count);
    return 0;
  });
}

}  // namespace

extern "C" {

// Ordered like CUDA's legacy default stream: it goes through the current
// device's default stream, so once execution is asynchronous this must also
// wait for it (today submission already completes the copy). It deliberately
// leaves the stream's sticky launch error for the next synchronisation.
mydevError_t mydevMemcpy(void* dst, const void* src, size_t count, mydevMemcpyKind kind) {
  return copyOnStream(dst, src, count, kind, nullptr);
}

mydevError_t mydevMemcpyAsync(void* dst, const void* src, size_t count, mydevMemcpyKind kind,
                              mydevStream_t stream) {
  return copyOnStream(dst, src, count, kind, stream);
}

mydevError_t mydevMemsetAsync(void* dst, int value, size_t count, mydevStream_t stream) {
  if (mydevError_t e = ensureInitialized()) return e;
  std::shared_ptr<mydevStream_st> s;
  if (mydevError_t e = resolveStream(stream, &s)) return e;
  if (count == 0) return mydevSuccess;
  if (mydevError_t e = validateRanges({{dst, count, true}})) return e;
  return submitToStream(*s, [=] {
    AccessWindow window;
    std::memset(dst, value, count);
    return 0;
  });
}

}  // extern "C"
