// The DeviceGuardImplInterface for mydev: what c10::DeviceGuard, torch.Stream,
// torch.Event and torch.accelerator call.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "Device.h"
#include "Allocator.h"
#include "Exception.h"
#include "Launch.h"
#include "Stream.h"

namespace my_device {
namespace {

mydevEvent_t create_event(c10::EventFlag flag) {
  mydevEvent_t event = nullptr;
  // PYTORCH_DEFAULT is torch.Event(enable_timing=False); BACKEND_DEFAULT enables timing.
  const unsigned flags = flag == c10::EventFlag::BACKEND_DEFAULT ? mydevEventDefault : mydevEventDisableTiming;
  MYDEV_CHECK(mydevEventCreateWithFlags(&event, flags));
  return event;
}

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kMyDev;
  }

  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    if (previous.index() != device.index()) {
      setDevice(device);
    }
    return previous;
  }

  c10::Device getDevice() const override {
    return c10::Device(kMyDev, current_device());
  }

  void setDevice(c10::Device device) const override {
    TORCH_INTERNAL_ASSERT(device.type() == kMyDev);
    check_device_index(device.index());
    set_device(device.index());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    mydevSetDevice(device.index());
  }

  c10::Stream getStream(c10::Device device) const override {
    return current_stream(device.index());
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    return default_stream(device.index());
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool is_high_priority) const override {
    return stream_from_pool(device.index(), is_high_priority ? stream_priority_range().second : 0);
  }

  c10::Stream getNewStream(c10::Device device, int priority) const override {
    return stream_from_pool(device.index(), priority);
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    const c10::Stream previous = current_stream(stream.device_index());
    set_current_stream(stream);
    return previous;
  }

  void* getStreamNativeHandle(const c10::Stream stream) const override {
    return stream_handle(stream);
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }

  // torch.accelerator.get_device_capability: the dtypes a mydev tensor can be
  // allocated in and converted between (every kernel is a CPU kernel, so the
  // device runs what the CPU runs). Left out: the quantized types (quantized
  // tensors are not supported on mydev: quantize_per_tensor says so), and the
  // bit-packed and sub-byte placeholder types, which have no conversions on
  // any device. test_device_capability.py allocates and converts each one.
  c10::DeviceCapability getDeviceCapability(c10::Device device) const override {
    check_device_index(device.has_index() ? device.index() : current_device());
    c10::DeviceCapability cap;
    cap.capability_data.capability_bits = 0;
    for (const c10::ScalarType t :
         {c10::kByte, c10::kChar, c10::kShort, c10::kInt, c10::kLong, c10::kUInt16, c10::kUInt32, c10::kUInt64,
          c10::kBool, c10::kHalf, c10::kBFloat16, c10::kFloat, c10::kDouble, c10::kComplexHalf,
          c10::kComplexFloat, c10::kComplexDouble, c10::kFloat8_e5m2, c10::kFloat8_e4m3fn,
          c10::kFloat8_e5m2fnuz, c10::kFloat8_e4m3fnuz, c10::kFloat8_e8m0fnu, c10::kQInt8, c10::kQUInt8,
          c10::kQInt32, c10::kQUInt4x2, c10::kQUInt2x4}) {
      cap.capability_data.capability_bits |= 1ULL << static_cast<int>(t);
    }
    return cap;
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "Event device index ", static_cast<int>(device_index),
                " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    RuntimeDeviceGuard on_device(stream.device_index());
    if (*event == nullptr) {
      *event = create_event(flag);
    }
    MYDEV_CHECK(mydevEventRecord(static_cast<mydevEvent_t>(*event), stream_handle(stream)));
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    RuntimeDeviceGuard on_device(stream.device_index());
    MYDEV_CHECK(mydevStreamWaitEvent(stream_handle(stream), static_cast<mydevEvent_t>(event)));
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    const mydevError_t err = mydevEventQuery(static_cast<mydevEvent_t>(event));
    if (err == mydevErrorNotReady) return false;
    MYDEV_CHECK(err);
    // As cudaEventQuery returns an earlier launch's asynchronous error.
    raise_kernel_failure_after_host_read(current_device());
    return true;
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    if (event != nullptr) mydevEventDestroy(static_cast<mydevEvent_t>(event));
  }

  void synchronizeEvent(void* event) const override {
    finish_host_wait(event != nullptr ? mydevEventSynchronize(static_cast<mydevEvent_t>(event)) : mydevSuccess);
    // As cudaEventSynchronize returns an earlier launch's asynchronous error.
    raise_kernel_failure_after_host_read(current_device());
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    float ms = 0;
    const mydevError_t err =
        mydevEventElapsedTime(&ms, static_cast<mydevEvent_t>(start), static_cast<mydevEvent_t>(end));
    TORCH_CHECK_VALUE(err != mydevErrorTimingDisabled,
                      "Both events must be created with argument 'enable_timing=True'.");
    MYDEV_CHECK(err);
    return ms;
  }

  bool queryStream(const c10::Stream& stream) const override {
    RuntimeDeviceGuard on_device(stream.device_index());
    const mydevError_t err = mydevStreamQuery(stream_handle(stream));
    if (err == mydevErrorNotReady) return false;
    MYDEV_CHECK(err);
    // As cudaStreamQuery returns an earlier launch's asynchronous error.
    raise_kernel_failure_after_host_read(stream.device_index());
    return true;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    RuntimeDeviceGuard on_device(stream.device_index());
    finish_host_wait(mydevStreamSynchronize(stream_handle(stream)));
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    RuntimeDeviceGuard on_device(device_index);
    finish_host_wait(mydevDeviceSynchronize());
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    record_stream(data_ptr, stream);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

} // namespace
} // namespace my_device
