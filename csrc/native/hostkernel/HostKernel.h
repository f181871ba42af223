#pragma once
// The host kernel: the one boxed kernel that serves every aten op mydev has no
// kernel of its own for, by running the op's CPU kernel on device memory.
//
// A call goes, in one direction:
//   HostKernel.cpp       finds the call's device, then either
//   QueuedHostKernel.cpp queues it (Plan.h says whether the op may be queued,
//                        MetaCache.h gives its outputs' shapes), or
//   HostKernel.cpp       runs it now, in stream order (launch_inline);
//   HostCall.h           is how either runs a CPU kernel on device bytes.
// Registration.cpp registers it for the ops it serves.
#include <ATen/core/dispatch/Dispatcher.h>

#include "HostCall.h"

namespace my_device {

// The boxed host kernel, usable for any op whose CPU kernel is registered.
void host_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

// Whether an argument is written though its schema does not say so: the running statistics of the batch
// and instance norms (native_batch_norm, batch_norm, instance_norm, batch_norm_update_stats predate write
// annotations; _native_batch_norm_legit marks them).
bool writes_unannotated(const c10::Argument& a);
// The operator overload named "aten::name.overload" (or "aten::name"), looked up once.
const c10::OperatorHandle& op_named(const char* label);

} // namespace my_device
