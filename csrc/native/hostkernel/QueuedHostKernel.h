#pragma once
// Host-kernel calls queued on the stream (see QueuedHostKernel.cpp).
#include <ATen/core/dispatch/Dispatcher.h>

namespace my_device {

// Queues the host kernel call on `stack` (the op's arguments) as a kernel on
// `device`'s current stream, leaving its results on the stack, if the op and
// the call allow it (Plan.h). Returns false, with the stack untouched, when
// the call must run in stream order now instead.
bool queue_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device);
// Whether the call queue_host_kernel just declined waits for its first run
// at the call to confirm its signature (see Signature in MetaCache.h).
bool awaiting_confirmation();
// Call after that run ended without error, with its `nreturns` results on top
// of `stack`, and whether it warned: later calls of the same signature are
// then queued, provided the results have the sizes, dtypes and layout the
// Meta kernel gave and it did not warn.
void confirm_signature(const torch::jit::Stack& stack, size_t nreturns, bool warned);

} // namespace my_device
