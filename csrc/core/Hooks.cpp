// PrivateUse1HooksInterface: how device-generic PyTorch code (autograd's
// engine, AOTAutograd, torch.Generator, pin_memory, torch.accelerator) asks the
// backend about itself. Without it backward() fails outright.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Storage.h>
#include <c10/util/CallOnce.h>

#include "Allocator.h"
#include "Device.h"
#include "Exception.h"
#include "Generator.h"

namespace my_device {
namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return device_count() > 0;
  }
  void init() const override {
    // Any runtime call other than the device count initialises it.
    int device = 0;
    MYDEV_CHECK(mydevGetDevice(&device));
  }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return mydevIsInitialized() != 0 && device_index >= 0 && device_index < device_count();
  }
  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_device_index(device);
    set_device(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::DeviceIndex previous = current_device();
    if (previous != device) setCurrentDevice(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return make_generator(device_index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    mydevPointerAttributes attr{};
    MYDEV_CHECK(mydevPointerGetAttributes(&attr, data));
    TORCH_CHECK(attr.type == mydevMemoryTypeDevice, "pointer ", data, " is not mydev device memory");
    return c10::Device(kMyDev, static_cast<c10::DeviceIndex>(attr.device));
  }
  bool isPinnedPtr(const void* data) const override {
    // Asking must not initialise the runtime (DataLoader asks from workers).
    if (data == nullptr || !mydevIsInitialized() || in_bad_fork()) return false;
    mydevPointerAttributes attr{};
    return mydevPointerGetAttributes(&attr, data) == mydevSuccess && attr.type == mydevMemoryTypeHost;
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return pinned_allocator();
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override;
};

} // namespace

// Defined in native/Resize.cpp, which owns storage resizing.
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_bytes);

void Hooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const {
  resize_storage_bytes(storage.unsafeGetStorageImpl(), new_bytes);
}

namespace {
const bool g_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  return true;
}();
} // namespace

} // namespace my_device
