#pragma once
// Host-kernel calls queued on the stream (see QueuedHostKernel.cpp).
#include <ATen/core/dispatch/Dispatcher.h>

namespace my_device {

// Queues the host kernel call on `stack` (the op's arguments) as a kernel on
// `device`'s current stream, leaving its results on the stack, if the op and
// the call allow it (Plan.h). Returns false, with the stack untouched, when
// the call must run in stream order now instead.
bool queue_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device);
// Call after the host kernel that queue_host_kernel just declined ran at the
// call without error, with its `nreturns` results on top of `stack`: its
// dtypes (half, bfloat16, integers, and any for ops outside the listed
// families) are then known to have a CPU kernel, and later calls with them are
// queued, provided the results have the sizes and dtypes the Meta kernel gave.
void confirm_queueable_dtypes(const torch::jit::Stack& stack, size_t nreturns);

} // namespace my_device
