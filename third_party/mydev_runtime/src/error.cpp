// Error names and messages. Pure functions: they never initialise the runtime
// and work in a forked child, because they are what reports those conditions.
#include "internal.h"

namespace {

struct ErrorText {
  mydevError_t code;
  const char* name;
  const char* message;
};

constexpr ErrorText kErrors[] = {
    {mydevSuccess, "mydevSuccess", "no error"},
    {mydevErrorInvalidValue, "mydevErrorInvalidValue", "invalid argument"},
    {mydevErrorMemoryAllocation, "mydevErrorMemoryAllocation", "out of memory"},
    {mydevErrorInvalidDevice, "mydevErrorInvalidDevice", "invalid device ordinal"},
    {mydevErrorInvalidDevicePointer, "mydevErrorInvalidDevicePointer", "invalid device pointer"},
    {mydevErrorNotReady, "mydevErrorNotReady", "device not ready"},
    {mydevErrorInvalidResourceHandle, "mydevErrorInvalidResourceHandle", "invalid resource handle"},
    {mydevErrorInitializationError, "mydevErrorInitializationError",
     "initialization error: the runtime cannot be used in a process forked after it was initialised"},
    {mydevErrorLaunchFailure, "mydevErrorLaunchFailure", "launched function reported failure"},
    {mydevErrorTimingDisabled, "mydevErrorTimingDisabled", "event was created with timing disabled"},
    {mydevErrorInvalidHostPointer, "mydevErrorInvalidHostPointer", "invalid host pointer"},
    {mydevErrorStreamCaptureUnsupported, "mydevErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {mydevErrorStreamCaptureInvalidated, "mydevErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {mydevErrorStreamCaptureUnjoined, "mydevErrorStreamCaptureUnjoined",
     "capture ended with a forked stream not joined back into the capturing stream"},
    {mydevErrorStreamCaptureIsolation, "mydevErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {mydevErrorStreamCaptureUnmatched, "mydevErrorStreamCaptureUnmatched",
     "capture was not initiated in this stream"},
    {mydevErrorStreamCaptureWrongThread, "mydevErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {mydevErrorCapturedEvent, "mydevErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {mydevErrorIllegalState, "mydevErrorIllegalState", "operation not permitted in the current capture state"},
};

const ErrorText* find(mydevError_t error) {
  for (const ErrorText& e : kErrors) {
    if (e.code == error) return &e;
  }
  return nullptr;
}

}  // namespace

extern "C" {

const char* mydevGetErrorName(mydevError_t error) {
  const ErrorText* e = find(error);
  return e ? e->name : "unrecognized error code";
}

const char* mydevGetErrorString(mydevError_t error) {
  const ErrorText* e = find(error);
  return e ? e->message : "unrecognized error code";
}

}  // extern "C"
