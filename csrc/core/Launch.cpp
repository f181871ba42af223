#include "Launch.h"

#include "Allocator.h"
#include "HotThreadLocal.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <type_traits>
#include <utility>
#include <vector>

namespace my_device {
namespace {
std::mutex g_mutex;
// Unreported failures per device, oldest first (as the runtime reports them).
std::unordered_map<c10::DeviceIndex, std::deque<KernelFailure>> g_failures;
std::string g_injected;
std::atomic<bool> g_any_injected{false};
std::atomic<bool> g_any_failure{false};  // g_failures is not empty
std::atomic<int> g_sync_debug_mode{0};

// Finished tasks, a lock-free stack: workers push one at a time, host threads
// take the whole stack at once (no pop of single nodes, so no ABA problem).
std::atomic<LaunchedTask*> g_retired{nullptr};

// Warnings of queued kernels not yet raised on a host thread.
std::mutex g_warnings_mutex;
std::vector<c10::Warning> g_warnings;
std::atomic<bool> g_any_warning{false};

struct KernelWarningCollector final : c10::WarningHandler {
  void process(const c10::Warning& warning) override {
    std::lock_guard<std::mutex> lock(g_warnings_mutex);
    g_warnings.push_back(warning);
    g_any_warning.store(true, std::memory_order_release);
  }
};

// One thread-local, not two, and a plain aggregate, zero-initialised, so that
// no access also checks a per-thread initialisation guard. Initial-exec
// (HotThreadLocal.h): every op asks whether it runs inside a kernel.
struct KernelTls {
  KernelContext kernel;
  bool in_kernel;
};
static_assert(std::is_trivially_default_constructible_v<KernelTls>);
MYDEV_HOT_TLS thread_local KernelTls tls_kernel;
} // namespace

const KernelContext* current_kernel() {
  KernelTls& t = tls_kernel;
  return t.in_kernel ? &t.kernel : nullptr;
}

KernelScope::KernelScope(const KernelContext& kernel) {
  KernelTls& t = tls_kernel;
  entered_ = !t.in_kernel;
  if (entered_) {
    t.kernel = kernel;
    t.in_kernel = true;
    threads_.emplace(kernel.threads);
  }
}

KernelScope::~KernelScope() {
  if (entered_) tls_kernel.in_kernel = false;
}

KernelContext kernel_context(c10::DeviceIndex device, mydevStream_t stream) {
  return {device, stream, free_clock(device), false, kernel_intra_op_threads()};
}

KernelContext kernel_context(c10::DeviceIndex device) {
  return kernel_context(device, current_stream_handle(device));
}

void finish_launch(c10::DeviceIndex device, mydevError_t err) {
  if (C10_UNLIKELY(err != mydevSuccess)) {
    // A failure names the runtime's current device (raise_runtime_error), which
    // launches do not switch (their stream handle names the device).
    RuntimeDeviceGuard on_device(device);
    if (err == mydevErrorLaunchFailure) {
      // MYDEV_LAUNCH_BLOCKING: the kernel ran and failed. Report it here, and
      // consume the stream's sticky copy so the next synchronisation does not repeat it.
      mydevStreamSynchronize(current_stream_handle(device));
    }
    MYDEV_CHECK(err);
  }
  if (!in_kernel()) raise_kernel_warnings();
}

void retire_kernel(LaunchedTask* task) {
  LaunchedTask* head = g_retired.load(std::memory_order_relaxed);
  do {
    task->next_retired = head;
  } while (!g_retired.compare_exchange_weak(head, task, std::memory_order_release, std::memory_order_relaxed));
}

bool has_finished_kernels() {
  return g_retired.load(std::memory_order_acquire) != nullptr;
}

void reap_finished_kernels() {
  if (g_retired.load(std::memory_order_relaxed) == nullptr) return;
  LaunchedTask* task = g_retired.exchange(nullptr, std::memory_order_acquire);
  while (task != nullptr) {
    LaunchedTask* next = task->next_retired;
    delete task;
    task = next;
  }
}

c10::WarningHandler* kernel_warning_collector() {
  static KernelWarningCollector collector;  // stateless: the warnings are in g_warnings
  return &collector;
}

void raise_kernel_warnings() {
  if (!g_any_warning.load(std::memory_order_acquire)) return;
  std::vector<c10::Warning> warnings;
  {
    std::lock_guard<std::mutex> lock(g_warnings_mutex);
    warnings.swap(g_warnings);
    g_any_warning.store(false, std::memory_order_relaxed);
  }
  for (const c10::Warning& w : warnings) c10::warn(w);
}

void finish_host_wait(mydevError_t err) {
  reap_finished_kernels();
  raise_kernel_warnings();
  MYDEV_CHECK(err);
}

void record_kernel_failure(c10::DeviceIndex device, const char* label, const std::string& what, ErrorKind kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& pending = g_failures[device];
  // (Bounded as the runtime bounds each stream's: a loop of failing kernels.)
  if (pending.size() >= 4096) return;
  pending.push_back({std::string(label) + ": " + what, kind});
  g_any_failure.store(true);
}

void raise_kernel_failure_after_host_read(c10::DeviceIndex device) {
  if (!in_kernel()) raise_kernel_warnings();
  // Inside a kernel the copy waited for nothing, and waiting here could deadlock.
  if (!g_any_failure.load(std::memory_order_relaxed) || in_kernel()) return;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_failures.find(device);
    if (it == g_failures.end() || it->second.empty()) return;
  }
  // The streams the read waited for are idle; this takes (and clears) the
  // device's sticky errors and raise_runtime_error names the op. As with CUDA's
  // device-wide sticky errors, a failure of work another thread launched since
  // may be the one reported here.
  RuntimeDeviceGuard on_device(device);
  MYDEV_CHECK(mydevDeviceSynchronize());
}

KernelFailure take_kernel_failure(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_failures.find(device);
  if (it == g_failures.end()) return {};
  KernelFailure failure = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) g_failures.erase(it);
  g_any_failure.store(!g_failures.empty());
  return failure;
}

void set_sync_debug_mode(int mode) {
  TORCH_CHECK(mode >= 0 && mode <= 2, "invalid value of debug_mode, expected one of `default`, `warn`, `error`");
  g_sync_debug_mode.store(mode, std::memory_order_relaxed);
}

int sync_debug_mode() {
  return g_sync_debug_mode.load(std::memory_order_relaxed);
}

namespace {
thread_local bool tls_unreported_sync = false;
} // namespace

UnreportedSync::UnreportedSync() : previous_(std::exchange(tls_unreported_sync, true)) {}
UnreportedSync::~UnreportedSync() {
  tls_unreported_sync = previous_;
}

void warn_or_error_on_sync() {
  const int mode = g_sync_debug_mode.load(std::memory_order_relaxed);
  if (mode == 0 || tls_unreported_sync) return;
  // The message torch.cuda gives, with the device's name.
  TORCH_CHECK(mode != 2, "called a synchronizing mydev operation");
  TORCH_WARN("called a synchronizing mydev operation");
}

void inject_kernel_failure(const std::string& label) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_injected = label;
  g_any_injected.store(!label.empty());
}

bool take_injected_failure(const char* label) {
  if (!g_any_injected.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_injected.empty() || g_injected != label) return false;
  g_injected.clear();
  g_any_injected.store(false);
  return true;
}

} // namespace my_device
