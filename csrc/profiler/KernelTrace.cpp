#include "KernelTrace.h"

#include <mydev_activity.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace my_device {

// Defined in core/Stream.cpp, which owns the stream registry: the c10 id of a
// runtime stream handle (0 for the default stream's NULL handle).
int64_t stream_id_of(mydevStream_t handle);

namespace {
struct RawRecord {
  mydevActivityKind kind;
  std::string label;
  int device;
  mydevStream_t stream;
  uint64_t correlation;
  int64_t start_ns, end_ns;
  size_t bytes;
  bool at_the_call;
};

std::mutex g_mutex;
std::vector<RawRecord> g_records;
std::atomic<bool> g_tracing{false};

// Op nesting, from the correlation pushes: the ops open on this thread, and each traced op's caller.
thread_local std::vector<uint64_t> t_open_ops;
std::mutex g_callers_mutex;
std::unordered_map<uint64_t, uint64_t> g_callers;

// Stream tasks that are not kernels: the no-op task that keeps a copy's
// storages alive until the copy has run (native/Copy.cpp).
bool is_bookkeeping(const mydevActivityRecord& r) {
  return r.kind == mydevActivityKindKernel && std::strcmp(r.label, "copy keep-alive") == 0;
}

// On the thread that ran the work: copy what the record points to, no more.
void on_activity(const mydevActivityRecord* r, void*) {
  if (is_bookkeeping(*r)) return;
  RawRecord raw{r->kind, r->label, r->device, r->stream, r->correlation_id,
                r->start_ns, r->end_ns, r->bytes, r->inline_launch != 0};
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.push_back(std::move(raw));
}
} // namespace

void start_kernel_tracing() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.clear();
  }
  {
    std::lock_guard<std::mutex> lock(g_callers_mutex);
    g_callers.clear();
  }
  g_tracing.store(true);
  mydevActivitySetCallback(&on_activity, nullptr);
}

std::vector<KernelRecord> stop_kernel_tracing() {
  mydevActivitySetCallback(nullptr, nullptr);
  g_tracing.store(false);
  std::vector<RawRecord> raw;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    raw.swap(g_records);
  }
  std::vector<KernelRecord> out;
  out.reserve(raw.size());
  for (RawRecord& r : raw) {
    const auto kind = r.kind == mydevActivityKindKernel   ? KernelRecord::Kind::Kernel
                      : r.kind == mydevActivityKindMemcpy ? KernelRecord::Kind::Memcpy
                                                          : KernelRecord::Kind::Memset;
    out.push_back({kind, std::move(r.label), static_cast<c10::DeviceIndex>(r.device), stream_id_of(r.stream),
                   r.correlation, r.start_ns, r.end_ns, r.bytes, r.at_the_call});
  }
  return out;
}

void push_correlation(uint64_t id) {
  mydevActivityPushExternalCorrelationId(id);
  if (!t_open_ops.empty() && g_tracing.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(g_callers_mutex);
    g_callers[id] = t_open_ops.back();
  }
  t_open_ops.push_back(id);
}

void pop_correlation() {
  mydevActivityPopExternalCorrelationId(nullptr);
  if (!t_open_ops.empty()) t_open_ops.pop_back();
}

uint64_t caller_correlation(uint64_t id) {
  std::lock_guard<std::mutex> lock(g_callers_mutex);
  auto it = g_callers.find(id);
  return it == g_callers.end() ? 0 : it->second;
}

} // namespace my_device
