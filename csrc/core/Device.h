#pragma once
#include <c10/core/Device.h>

#include <cstddef>

namespace my_device {

constexpr c10::DeviceType kMyDev = c10::DeviceType::PrivateUse1;
// The runtime's limit on MYDEV_DEVICE_COUNT: per-device tables are this long.
constexpr size_t kMaxDevices = 64;

c10::DeviceIndex device_count() noexcept;
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
// Raises "invalid device ordinal" for an index outside [0, device_count()).
void check_device_index(c10::DeviceIndex index);
// Resolves "mydev" (index -1) to the current device, as CUDA does.
c10::Device normalize(c10::Device device);
// Makes `index` the runtime's current device for a scope. Cheaper than
// c10::DeviceGuard and usable below the guard implementation itself.
class RuntimeDeviceGuard {
 public:
  explicit RuntimeDeviceGuard(c10::DeviceIndex index);
  ~RuntimeDeviceGuard();
  RuntimeDeviceGuard(const RuntimeDeviceGuard&) = delete;
  RuntimeDeviceGuard& operator=(const RuntimeDeviceGuard&) = delete;

 private:
  int previous_;
  bool changed_;
};

// True in a child forked after the runtime was initialised in the parent.
bool in_bad_fork();

} // namespace my_device
