#include "Exception.h"

#include <c10/core/Device.h>

#include <c10/util/Exception.h>

#include <string>

namespace my_device {

KernelFailure take_kernel_failure(c10::DeviceIndex device);  // Launch.cpp

ErrorKind error_kind(const c10::Error& e) {
  if (dynamic_cast<const c10::IndexError*>(&e)) return ErrorKind::Index;
  if (dynamic_cast<const c10::ValueError*>(&e)) return ErrorKind::Value;
  if (dynamic_cast<const c10::TypeError*>(&e)) return ErrorKind::Type;
  if (dynamic_cast<const c10::NotImplementedError*>(&e)) return ErrorKind::NotImplemented;
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return ErrorKind::OutOfMemory;
  if (dynamic_cast<const c10::LinAlgError*>(&e)) return ErrorKind::LinAlg;
  return ErrorKind::Runtime;
}

namespace {

[[noreturn]] void raise_kernel_failure(int device, const KernelFailure& failure) {
  const std::string message =
      c10::str("mydev error: a kernel failed on mydev:", device, ": ",
               failure.what.empty() ? std::string("(no details)") : failure.what,
               "\nKernel errors are reported asynchronously, at a later synchronisation; "
               "set MYDEV_LAUNCH_BLOCKING=1 to raise them where the kernel is launched.");
  switch (failure.kind) {
    case ErrorKind::Index:
      TORCH_CHECK_WITH(IndexError, false, message);
    case ErrorKind::Value:
      TORCH_CHECK_WITH(ValueError, false, message);
    case ErrorKind::Type:
      TORCH_CHECK_WITH(TypeError, false, message);
    case ErrorKind::NotImplemented:
      TORCH_CHECK_WITH(NotImplementedError, false, message);
    case ErrorKind::OutOfMemory:
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    case ErrorKind::LinAlg:
      TORCH_CHECK_WITH(LinAlgError, false, message);
    case ErrorKind::Runtime:
      break;
  }
  TORCH_CHECK(false, message);
}

} // namespace

void raise_runtime_error(mydevError_t err, const char* call, const char* file, int line) {
  switch (err) {
    case mydevErrorInitializationError:
      TORCH_CHECK(false,
          "Cannot re-initialize mydev in forked subprocess. To use mydev with "
          "multiprocessing, you must use the 'spawn' start method");
    case mydevErrorMemoryAllocation:
      TORCH_CHECK_WITH(OutOfMemoryError, false, "mydev error: out of memory (", call, ")");
    case mydevErrorInvalidDevice:
      TORCH_CHECK(false, "mydev error: invalid device ordinal");
    case mydevErrorLaunchFailure: {
      int device = 0;
      mydevGetDevice(&device);
      raise_kernel_failure(device, take_kernel_failure(static_cast<c10::DeviceIndex>(device)));
    }
    default:
      TORCH_CHECK(false, "mydev error: ", mydevGetErrorString(err), " (",
                  mydevGetErrorName(err), " from ", call, " at ", file, ":", line, ")");
  }
}

} // namespace my_device
