#include "Device.h"

#include <pthread.h>

#include <c10/util/Exception.h>
#include <mutex>

#include "Exception.h"

namespace my_device {

namespace {
bool g_bad_fork = false;

void on_fork_child() {
  g_bad_fork = mydevIsInitialized() != 0;
}

// Registered at load, so it also covers forks that happen before first use.
const bool g_fork_handler = [] {
  pthread_atfork(nullptr, nullptr, on_fork_child);
  return true;
}();
} // namespace

bool in_bad_fork() {
  return g_bad_fork;
}

c10::DeviceIndex device_count() noexcept {
  static const c10::DeviceIndex count = [] {
    int n = 0;
    return mydevGetDeviceCount(&n) == mydevSuccess ? static_cast<c10::DeviceIndex>(n) : 0;
  }();
  return count;
}

c10::DeviceIndex current_device() {
  int device = 0;
  MYDEV_CHECK(mydevGetDevice(&device));
  return static_cast<c10::DeviceIndex>(device);
}

void set_device(c10::DeviceIndex index) {
  MYDEV_CHECK(mydevSetDevice(index));
}

void check_device_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(),
              "mydev error: invalid device ordinal (device index ", static_cast<int>(index),
              " with ", static_cast<int>(device_count()), " mydev devices)");
}

c10::Device normalize(c10::Device device) {
  if (!device.has_index()) {
    return c10::Device(kMyDev, current_device());
  }
  check_device_index(device.index());
  return device;
}

RuntimeDeviceGuard::RuntimeDeviceGuard(c10::DeviceIndex index) : previous_(0), changed_(false) {
  MYDEV_CHECK(mydevGetDevice(&previous_));
  if (previous_ != index) {
    MYDEV_CHECK(mydevSetDevice(index));
    changed_ = true;
  }
}

RuntimeDeviceGuard::~RuntimeDeviceGuard() {
  if (changed_) {
    mydevSetDevice(previous_);
  }
}

} // namespace my_device
