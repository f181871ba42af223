#pragma once
#include <ATen/core/dispatch/Dispatcher.h>

namespace my_device {

// Queues the host kernel call on `stack` (the op's arguments) as a kernel on
// `device`'s current stream, leaving its results on the stack, if the op and
// the call allow it (see QueuedHostKernel.cpp). Returns false, with the stack
// untouched, when the call must run in stream order now instead.
bool queue_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device);

} // namespace my_device
