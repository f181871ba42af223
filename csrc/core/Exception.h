#pragma once
// Turns runtime error codes into the c10 errors PyTorch users expect:
// out-of-memory becomes torch.OutOfMemoryError, use after fork gets CUDA's
// wording, everything else a RuntimeError naming the runtime call.
#include <mydev_runtime.h>

#include <c10/util/Exception.h>

#include <string>

namespace my_device {

// A kernel's failure, kept until a synchronisation reports it: its message and
// the kind of c10 error it raised, so that the report is of the same Python
// type (an index out of range an IndexError, memory a torch.OutOfMemoryError),
// as it would be on CPU.
enum class ErrorKind : uint8_t { Runtime, Index, Value, Type, NotImplemented, OutOfMemory, LinAlg };
struct KernelFailure {
  std::string what;
  ErrorKind kind = ErrorKind::Runtime;
};
ErrorKind error_kind(const c10::Error& e);

[[noreturn]] void raise_runtime_error(mydevError_t err, const char* call, const char* file, int line);

} // namespace my_device

#define MYDEV_CHECK(EXPR)                                                  \
  do {                                                                     \
    mydevError_t __mydev_err = (EXPR);                                     \
    if (__builtin_expect(__mydev_err != mydevSuccess, 0)) {                \
      ::my_device::raise_runtime_error(__mydev_err, #EXPR, __FILE__, __LINE__); \
    }                                                                      \
  } while (0)
