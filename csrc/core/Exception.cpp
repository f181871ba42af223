#include "Exception.h"

#include <c10/core/Device.h>

#include <c10/util/Exception.h>

#include <string>

namespace my_device {

std::string take_kernel_failure(c10::DeviceIndex device);  // Launch.cpp

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
      const std::string what = take_kernel_failure(static_cast<c10::DeviceIndex>(device));
      TORCH_CHECK(false, "mydev error: a kernel failed on mydev:", device, ": ",
                  what.empty() ? std::string("(no details)") : what,
                  "\nKernel errors are reported asynchronously, at a later synchronisation; "
                  "set MYDEV_LAUNCH_BLOCKING=1 to raise them where the kernel is launched.");
    }
    default:
      TORCH_CHECK(false, "mydev error: ", mydevGetErrorString(err), " (",
                  mydevGetErrorName(err), " from ", call, " at ", file, ":", line, ")");
  }
}

} // namespace my_device
