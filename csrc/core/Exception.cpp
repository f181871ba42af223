#include "Exception.h"

#include <c10/util/Exception.h>

namespace my_device {

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
    default:
      TORCH_CHECK(false, "mydev error: ", mydevGetErrorString(err), " (",
                  mydevGetErrorName(err), " from ", call, " at ", file, ":", line, ")");
  }
}

} // namespace my_device
