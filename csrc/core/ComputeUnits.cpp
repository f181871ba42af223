#include "ComputeUnits.h"

#include <mydev_emulator.h>  // the emulator's compute units: a port rewrites this file

#include <exception>
#include <mutex>
#include <thread>

#include "Launch.h"

namespace my_device {
namespace {

struct ComputeUnitsCall {
  const std::function<void()>* work;
  std::thread::id caller;
  KernelContext context;
  std::mutex mutex;
  std::exception_ptr failure;
};

// The runtime calls this once per unit; nothing may unwind through it.
void run_on_unit(void* data) {
  auto* call = static_cast<ComputeUnitsCall*>(data);
  try {
    if (std::this_thread::get_id() == call->caller) {
      (*call->work)();
    } else {
      // A helper is a thread of its own: it takes on what a stream's worker has around a queued kernel.
      at::internal::lazy_init_num_threads();
      KernelThreadState state;
      KernelScope in_kernel(call->context);
      c10::WarningUtils::WarningHandlerGuard keep_warnings(kernel_warning_collector());
      (*call->work)();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(call->mutex);
    if (!call->failure) call->failure = std::current_exception();
  }
}

} // namespace

void run_on_compute_units(const std::function<void()>& work) {
  const KernelContext* kernel = current_kernel();
  if (kernel == nullptr) {
    work();
    return;
  }
  ComputeUnitsCall call{&work, std::this_thread::get_id(), *kernel, {}, nullptr};
  MYDEV_CHECK(mydevRunOnComputeUnits(run_on_unit, &call));
  if (call.failure) std::rethrow_exception(call.failure);
}

SideBySide side_by_side_asked() {
  static const SideBySide asked = [] {
    int count = 0, forced = 0;
    MYDEV_CHECK(mydevGetComputeUnits(&count, &forced));
    if (!forced) return SideBySide::Decide;
    return count > 1 ? SideBySide::Always : SideBySide::Never;
  }();
  return asked;
}

} // namespace my_device
