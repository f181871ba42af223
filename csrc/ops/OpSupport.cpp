// The my_device operator library, its event counters, and the device check.
#include "OpSupport.h"

#include <mutex>
#include <unordered_map>

namespace my_device::ops {
namespace {

std::mutex g_mutex;
std::unordered_map<std::string, int64_t> g_counts;

c10::Dict<std::string, int64_t> counters() {
  std::lock_guard<std::mutex> lock(g_mutex);
  c10::Dict<std::string, int64_t> out;
  for (const auto& [event, n] : g_counts) out.insert(event, n);
  return out;
}

void reset_counters() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_counts.clear();
}

} // namespace

void count_on_mydev(const char* event, const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kMyDev) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_counts[event];
}

c10::DeviceIndex check_same_device(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  std::optional<c10::Device> device;
  for (const at::Tensor* t : tensors) {
    if (t != nullptr && t->defined() && t->device().type() == kMyDev) {
      device = t->device();
      break;
    }
  }
  TORCH_INTERNAL_ASSERT(device.has_value(), op, ": the mydev kernel was called without a mydev tensor");
  for (const at::Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    TORCH_CHECK(t->device() == *device, op, ": expected all tensors to be on the same device, but found ", *device,
                " and ", t->device());
  }
  return device->index();
}

// Every my_device:: op is defined here or by a TORCH_LIBRARY_FRAGMENT next to
// its kernels. The counters are ops rather than Python bindings so that they
// need no change to Module.cpp.
TORCH_LIBRARY(my_device, m) {
  m.def("_counters() -> Dict(str, int)", &counters);
  m.def("_reset_counters() -> ()", &reset_counters);
}

} // namespace my_device::ops
