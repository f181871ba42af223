#include "Stream.h"

#include <algorithm>
#include <array>
#include <deque>
#include <memory>
#include <mutex>

#include "AutogradThread.h"
#include "Device.h"
#include "Exception.h"
#include "HotThreadLocal.h"

namespace my_device {
namespace {

struct StreamRecord {
  mydevStream_t handle;
  c10::DeviceIndex device;
  int priority;
};

constexpr int kPoolSize = 8;      // streams per device and priority, as CUDA's pools (of 32)

std::mutex g_mutex;
std::deque<StreamRecord> g_streams;  // id n > 0 is g_streams[n - 1]; deque keeps addresses stable

struct Pool {
  std::array<c10::StreamId, kPoolSize> ids{};
  unsigned next = 0;
};
// [device][priority index], priority index 0 = least (0), 1 = greatest (-1)
std::array<std::array<Pool, 2>, kMaxDevices> g_pools;

const std::array<mydevStream_t, kMaxDevices>& default_handles();

// A thread's current stream per device: its record (nullptr: the default
// stream) and the runtime handle every launch asks for. Reached through a
// pointer with the initial-exec model (HotThreadLocal.h); static TLS holds
// all of this library's thread-locals, so the 1 KiB table itself is on the
// heap, owned by a thread-local freed at thread exit. The pointer is set by
// the thread's first use of the device.
struct CurrentStreams {
  std::array<const StreamRecord*, kMaxDevices> record{};
  std::array<mydevStream_t, kMaxDevices> handle{};
};
thread_local std::unique_ptr<CurrentStreams> tls_current_table;
MYDEV_HOT_TLS thread_local CurrentStreams* tls_current = nullptr;

// A host thread's first use of the device: see thread_current.
C10_NOINLINE CurrentStreams& configure_thread() {
  tls_current_table = std::make_unique<CurrentStreams>();
  tls_current_table->handle = default_handles();
  tls_current = tls_current_table.get();
  configure_backward_thread();
  return *tls_current;
}

// Every launch asks for its current stream, so this is where a host thread's
// first use of the device is seen. (The first use is handled out of line: a
// call on the common path would make the compiler look the thread-local up
// once more after it, on every launch.)
inline CurrentStreams& thread_current() {
  CurrentStreams* current = tls_current;
  if (C10_UNLIKELY(current == nullptr)) return configure_thread();
  return *current;
}

const StreamRecord* record_of(const c10::Stream& stream) {
  if (stream.id() == 0) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(stream.id() > 0 && static_cast<size_t>(stream.id()) <= g_streams.size(),
              "Invalid mydev stream id ", stream.id());
  const StreamRecord* r = &g_streams[stream.id() - 1];
  TORCH_CHECK(r->device == stream.device_index(), "mydev stream ", stream.id(), " belongs to mydev:",
              static_cast<int>(r->device), ", not ", stream.device());
  return r;
}

c10::StreamId id_of(const StreamRecord* r) {
  if (r == nullptr) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t i = 0; i < g_streams.size(); ++i) {
    if (&g_streams[i] == r) return static_cast<c10::StreamId>(i + 1);
  }
  TORCH_INTERNAL_ASSERT(false, "unregistered mydev stream");
}

} // namespace

std::pair<int, int> stream_priority_range() {
  int least = 0, greatest = 0;
  MYDEV_CHECK(mydevDeviceGetStreamPriorityRange(&least, &greatest));
  return {least, greatest};
}

c10::Stream default_stream(c10::DeviceIndex device) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kMyDev, device), 0);
}

c10::Stream current_stream(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kMyDev, device), id_of(thread_current().record[device]));
}

void set_current_stream(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kMyDev, "expected a mydev stream, got ", stream);
  check_device_index(stream.device_index());
  const StreamRecord* r = record_of(stream);
  CurrentStreams& current = thread_current();
  current.record[stream.device_index()] = r;
  current.handle[stream.device_index()] = r == nullptr ? default_handles()[stream.device_index()] : r->handle;
}

c10::Stream stream_from_pool(c10::DeviceIndex device, int priority) {
  if (device < 0) device = current_device();
  check_device_index(device);
  const auto [least, greatest] = stream_priority_range();
  priority = std::min(least, std::max(greatest, priority));
  Pool& pool = g_pools[device][priority == least ? 0 : 1];
  std::lock_guard<std::mutex> lock(g_mutex);
  const unsigned slot = pool.next++ % kPoolSize;
  if (pool.ids[slot] == 0) {
    RuntimeDeviceGuard on_device(device);
    mydevStream_t handle = nullptr;
    MYDEV_CHECK(mydevStreamCreateWithPriority(&handle, priority));
    g_streams.push_back({handle, device, priority});
    pool.ids[slot] = static_cast<c10::StreamId>(g_streams.size());
  }
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kMyDev, device), pool.ids[slot]);
}

int stream_priority(const c10::Stream& stream) {
  const StreamRecord* r = record_of(stream);
  return r == nullptr ? 0 : r->priority;
}

namespace {

// The runtime's handle of each device's default stream (mydevDeviceGetDefault-
// Stream). Kernels launch on it rather than on NULL, whose meaning depends on
// the runtime's current device: every launch would then have to switch that
// to its own device and back, two thread-local accesses and calls around each
// of the two runtime calls of a kernel run at the call.
const std::array<mydevStream_t, kMaxDevices>& default_handles() {
  static const std::array<mydevStream_t, kMaxDevices> handles = [] {
    std::array<mydevStream_t, kMaxDevices> h{};
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) MYDEV_CHECK(mydevDeviceGetDefaultStream(d, &h[d]));
    return h;
  }();
  return handles;
}

} // namespace

bool is_default_stream_handle(mydevStream_t handle) {
  if (handle == nullptr) return true;
  const auto& handles = default_handles();
  return std::find(handles.begin(), handles.begin() + device_count(), handle) != handles.begin() + device_count();
}

// For the profiler's records of work that ran (profiler/KernelTrace.cpp), which
// name runtime streams: the c10 id of a handle (0: a default stream).
int64_t stream_id_of(mydevStream_t handle) {
  if (is_default_stream_handle(handle)) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t i = 0; i < g_streams.size(); ++i) {
    if (g_streams[i].handle == handle) return static_cast<int64_t>(i + 1);
  }
  return -1;  // not one of PyTorch's streams
}

mydevStream_t stream_handle(const c10::Stream& stream) {
  const StreamRecord* r = record_of(stream);
  return r == nullptr ? default_handles()[stream.device_index()] : r->handle;
}

mydevStream_t current_stream_handle(c10::DeviceIndex device) {
  return thread_current().handle[device];
}

} // namespace my_device
