#pragma once
// Which runtime stream work for a device goes to. Until streams other than the
// default exist on the PyTorch side, that is always the default stream.
#include <c10/core/Device.h>
#include <mydev_runtime.h>

namespace my_device {

inline mydevStream_t current_stream_handle(c10::DeviceIndex /*device*/) {
  return nullptr; // the runtime's default stream of the current device
}

} // namespace my_device
