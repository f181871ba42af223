// The legacy profiler's device timing (torch.autograd.profiler.profile(use_device="mydev"),
// whose use_kineto defaults to False): PyTorch's KINETO_PRIVATEUSE1_FALLBACK state records a
// device event when each op starts and ends, through the stubs a backend registers with
// registerPrivateUse1Methods, and reports the time between them as the op's device time. Without
// stubs every op fails with "PrivateUse1 used in profiler but not enabled". Kernel-level events
// come from the Kineto path instead (ActivityProfiler.cpp).
#include <torch/csrc/profiler/stubs/base.h>

#include <c10/util/ApproximateClock.h>

#include "../core/Device.h"
#include "../core/Exception.h"
#include "../core/Stream.h"

namespace my_device {
namespace {

struct MyDevProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex d = current_device();
    if (device != nullptr) *device = d;
    mydevEvent_t e = nullptr;
    RuntimeDeviceGuard on_device(d);
    MYDEV_CHECK(mydevEventCreateWithFlags(&e, mydevEventDefault));  // with timing
    *event = std::shared_ptr<void>(e, [](void* p) { mydevEventDestroy(static_cast<mydevEvent_t>(p)); });
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    MYDEV_CHECK(mydevEventRecord(e, current_stream_handle(d)));
  }

  // Microseconds, as the CUDA stubs return.
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    auto* e1 = static_cast<mydevEvent_t>(start->get());
    auto* e2 = static_cast<mydevEvent_t>(end->get());
    MYDEV_CHECK(mydevEventSynchronize(e2));
    float ms = 0;
    MYDEV_CHECK(mydevEventElapsedTime(&ms, e1, e2));
    return ms * 1000.0f;
  }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override {
    return true;
  }
  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex saved = current_device();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      set_device(d);
      op(d);
    }
    set_device(saved);
  }
  void synchronize() const override {
    MYDEV_CHECK(mydevDeviceSynchronize());
  }
};

const bool g_registered = [] {
  static MyDevProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  return true;
}();

} // namespace
} // namespace my_device
