#pragma once
// Turns runtime error codes into the c10 errors PyTorch users expect:
// out-of-memory becomes torch.OutOfMemoryError, use after fork gets CUDA's
// wording, everything else a RuntimeError naming the runtime call.
#include <mydev_runtime.h>

namespace my_device {

[[noreturn]] void raise_runtime_error(mydevError_t err, const char* call, const char* file, int line);

} // namespace my_device

#define MYDEV_CHECK(EXPR)                                                  \
  do {                                                                     \
    mydevError_t __mydev_err = (EXPR);                                     \
    if (__builtin_expect(__mydev_err != mydevSuccess, 0)) {                \
      ::my_device::raise_runtime_error(__mydev_err, #EXPR, __FILE__, __LINE__); \
    }                                                                      \
  } while (0)
