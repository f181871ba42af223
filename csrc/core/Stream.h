#pragma once
// mydev streams as PyTorch sees them. A c10::Stream's id names a runtime
// stream: 0 is the device's default stream (its handle is the runtime's
// mydevDeviceGetDefaultStream, never NULL), ids > 0 index a process-wide
// registry. Streams are never destroyed, as with CUDA's
// stream pools, so a c10::Stream stays valid wherever it is copied.
#include <c10/core/Stream.h>
#include <mydev_runtime.h>

namespace my_device {

c10::Stream default_stream(c10::DeviceIndex device);
// The current stream of `device` on this thread (the default stream unless set).
c10::Stream current_stream(c10::DeviceIndex device);
void set_current_stream(const c10::Stream& stream);
// A stream from the device's pool for that priority (round-robin, created lazily).
c10::Stream stream_from_pool(c10::DeviceIndex device, int priority);
int stream_priority(const c10::Stream& stream);
std::pair<int, int> stream_priority_range();  // {least, greatest}

// Runtime handles name their device's stream whatever the runtime's current
// device is: no device switch is needed around a call that takes one.
mydevStream_t stream_handle(const c10::Stream& stream);
// The runtime handle of the current stream of `device`: what kernels launch on.
mydevStream_t current_stream_handle(c10::DeviceIndex device);
// A default stream's handle (or NULL): what CUDA's memory snapshots call stream 0.
bool is_default_stream_handle(mydevStream_t handle);

} // namespace my_device
