// Private interfaces shared between the runtime's source files. Nothing here is
// part of the contract in include/mydev_runtime.h.
#ifndef MYDEV_RUNTIME_INTERNAL_H
#define MYDEV_RUNTIME_INTERNAL_H

#include "mydev_runtime.h"
#include "mydev_emulator.h"
#include "mydev_activity.h"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

// For the few thread-locals every launch reads: initial-exec makes each access
// one load relative to the thread pointer instead of a call to __tls_get_addr,
// at the price of room in the static TLS block, which is small when a library
// is loaded after start-up. Only for small variables.
#if defined(__GNUC__) && defined(__linux__)
#define MYDEV_HOT_TLS __attribute__((tls_model("initial-exec")))
#else
#define MYDEV_HOT_TLS
#endif

// For the functions between a short launch and the launched function, which
// runs under every frame between them: around a kernel's deep call chain a
// frame costs several times what it costs around a small function (5-6 ns
// against 1.4 ns in my_device's bench/bench_call_depth.py).
#if defined(__GNUC__)
#define MYDEV_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define MYDEV_ALWAYS_INLINE inline
#endif

namespace mydev_detail {

// ---- device.cpp ----------------------------------------------------------
struct Config {
  int device_count;
  size_t memory_limit;
  bool strict;
  bool launch_blocking;  // MYDEV_LAUNCH_BLOCKING=1: every enqueue waits for its task
  // MYDEV_LAUNCH_QUEUE_DEPTH: how many tasks a stream holds queued but not yet
  // started before an enqueue waits for room; 0 means no limit.
  size_t launch_queue_depth;
};

// Parsed from the environment once, on first call. Does not initialise the
// runtime, so mydevGetDeviceCount can use it.
const Config& config();

// Lazy initialisation. Every entry point except the four "pure query" ones
// calls this first; it fails only in a child forked from an initialised parent.
mydevError_t ensureInitialized();
bool inPoisonedChild();

int currentDevice();
void setCurrentDevice(int device);  // caller has validated the index
bool validDevice(int device);

// ---- memory.cpp ----------------------------------------------------------
// Builds the registry eagerly so the fault handler never has to construct it.
void initMemoryRegistry();
// One side of a copy or memset, checked against the allocation registry.
struct RangeCheck {
  const void* ptr;
  size_t bytes;
  bool device;  // true: must lie in one device allocation; false: must avoid device memory
  int* device_out = nullptr;  // device ranges only: receives the allocation's device
  // Device ranges only: receives the kernel address of ptr, through which the
  // runtime's copies and memsets reach the bytes (ptr itself outside strict mode).
  void** kernel_out = nullptr;
};
// Checks all ranges under one registry lock, in order; the first failure wins.
mydevError_t validateRanges(std::initializer_list<RangeCheck> ranges);

struct FaultAllocation {
  uintptr_t base;
  size_t size;
  int device;
  // A strict-mode allocation already freed (its views stay reserved for a
  // while, see memory.cpp), reached at its kernel address or its device address.
  bool freed = false;
  bool kernel_view = false;
};
// For the SIGSEGV handler: never blocks indefinitely and allocates nothing.
bool findDeviceAllocationForSignal(uintptr_t addr, FaultAllocation* out);

// ---- strict_fault.cpp ------------------------------------------------------
void installStrictFaultHandler();

// ---- event.cpp / stream.cpp -------------------------------------------------
// One recording of an event. EventRecord makes a new marker (the event's
// "generation") and enqueues it; the stream worker completes it. A
// StreamWaitEvent or EventSynchronize holds the marker current at its call, so
// re-recording the event later does not change what it waits for.
struct EventMarker {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;      // guarded by mu
  int64_t completed_ns = 0;  // steady_clock, guarded by mu
  // Where the record was queued, for a host that synchronises with it and may
  // run the stream's queue up to it (drainToRecord): the stream, and its
  // enqueued count with the record in it. Set under mu once queued.
  std::weak_ptr<mydevStream_st> stream;
  uint64_t position = 0;
  // Recorded on a capturing stream (graph.cpp): the capture's id, and the
  // stream's position in its graph then (the nodes a waiter depends on).
  // Such a record is never reached: done stays false. Guarded by mu.
  uint64_t capture_id = 0;
  std::vector<uint32_t> capture_frontier;
};
void completeMarker(EventMarker& m);
void waitMarker(EventMarker& m);
int64_t nowNs();

// ---- stream.cpp ----------------------------------------------------------
// What the submitting thread waits on under MYDEV_LAUNCH_BLOCKING=1.
struct BlockingWait {
  bool done = false;  // guarded by the stream's mutex
  int rc = 0;
};

// One unit of stream work. A small value type (no per-task std::function) so
// an enqueue is a lock, a deque push and at most one notify.
struct Task {
  // kInlineGate: the place in the queue of a mydevLaunchHostFuncInline; the
  // worker stops there until the calling thread has run the function.
  enum class Kind : uint8_t { kLaunch, kCopy, kMemset, kEventRecord, kEventWait, kInlineGate };
  Kind kind = Kind::kLaunch;
  int value = 0;                        // memset byte
  mydevHostFn_t fn = nullptr;           // launch
  void* ptr = nullptr;                  // launch user_data, copy/memset destination
  const void* src = nullptr;            // copy source
  size_t count = 0;                     // copy/memset bytes
  std::shared_ptr<EventMarker> marker;  // record/wait
  // Launch label, reported if it fails. Inline rather than a std::string so a
  // labelled enqueue allocates nothing; longer labels are truncated.
  static constexpr size_t kLabelCapacity = MYDEV_MAX_LABEL_LENGTH + 1;
  char label[kLabelCapacity];  // NUL-terminated; "" unless set

  BlockingWait* waiter = nullptr;       // MYDEV_LAUNCH_BLOCKING submitter, or inline gate caller
  bool traced = false;                  // activity tracing was on at enqueue (activity.cpp)
  uint64_t correlation = 0;             // the enqueuing thread's external correlation id

  Task() { label[0] = '\0'; }
  // Moves copy the label up to its terminator: the implicit move copied all
  // of its bytes one at a time, the largest single cost of a launch's enqueue.
  Task(Task&& other) noexcept { *this = std::move(other); }
  Task& operator=(Task&& other) noexcept {
    kind = other.kind;
    value = other.value;
    fn = other.fn;
    ptr = other.ptr;
    src = other.src;
    count = other.count;
    marker = std::move(other.marker);
    waiter = other.waiter;
    traced = other.traced;
    correlation = other.correlation;
    std::memcpy(label, other.label, std::strlen(other.label) + 1);
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
};

// Activity tracing (activity.cpp). activityEnabled is one relaxed load.
bool activityEnabled();
uint64_t activityCorrelation();  // the calling thread's innermost external correlation id, or 0
int64_t activityClockNs();
void activityEmit(const mydevActivityRecord& record);

void initDefaultStreams();
// NULL resolves to the current device's default stream; anything else must be
// a live handle. The shared_ptr keeps the stream alive while work is submitted
// even if another thread destroys the handle meanwhile.
mydevError_t resolveStream(mydevStream_t handle, std::shared_ptr<mydevStream_st>* out);
int streamDevice(const mydevStream_st& stream);
// The one place work enters a stream: enqueues it for the stream's worker and
// returns at once (under MYDEV_LAUNCH_BLOCKING=1, once the task has run, with
// mydevErrorLaunchFailure if it was a failing launch).
mydevError_t submitToStream(const std::shared_ptr<mydevStream_st>& stream, Task&& task);
// Waits for all work on the device's streams; reports and clears sticky errors.
mydevError_t synchronizeDevice(int device);
// Waits for all work enqueued so far on every stream of the device, leaving
// sticky errors alone (the synchronous copy's ordering).
void waitDeviceIdle(int device);
// True on a stream worker thread, i.e. inside a launched function or copy.
bool onStreamWorker();
// The threads that run one task's independent work (compute_units.cpp): how
// many, the worker included, and whether that was asked for explicitly.
struct ComputeUnits {
  int count;
  bool always;
};
ComputeUnits computeUnits();
// mydevRunOnComputeUnits.
void runOnComputeUnits(void (*fn)(void*), void* data);
// EventSynchronize's first resort, as a stream synchronisation's: if the
// calling thread may run the queue of the stream m was recorded on, runs it up
// to the record (which then has completed) once the task in progress ends.
void drainToRecord(EventMarker& m);

// Marks the calling thread's stream (the one whose task or inline function it
// is running; none on other threads) as waiting for other work, for as long as
// the scope lives: lower-priority streams are then not held back for it, since
// what it waits for may be their work. Never hold a marker or stream lock
// across its construction or destruction (lock order: stream first).
class BlockedScope {
 public:
  BlockedScope();
  ~BlockedScope();
  BlockedScope(const BlockedScope&) = delete;
  BlockedScope& operator=(const BlockedScope&) = delete;

 private:
  mydevStream_st* stream_;
};

// The failure of work the calling thread runs for its stream (a replayed
// graph's node), reported as a failed launch labelled `label`.
void recordWorkerFailure(const char* label);
// Set once process exit has stopped the workers.
bool runtimeExiting();
// A stream's capture (graph.cpp): 0 when not capturing; set and cleared by
// graph.cpp under its lock, read anywhere (one relaxed load on each enqueue).
uint64_t streamCaptureId(const mydevStream_st& stream);
void setStreamCaptureId(mydevStream_st& stream, uint64_t id);
bool isDefaultStream(const mydevStream_st& stream);

// ---- graph.cpp -----------------------------------------------------------
// Work enqueued on a capturing stream (submitToStream): a launch, copy or
// memset becomes a node, an event record the stream's position in the graph.
mydevError_t captureTask(const std::shared_ptr<mydevStream_st>& stream, Task&& task);
// mydevStreamWaitEvent where the stream is capturing or the event was
// recorded in a capture: a dependency, or the stream joining the capture.
mydevError_t captureWait(const std::shared_ptr<mydevStream_st>& stream, const std::shared_ptr<EventMarker>& marker);
// A host call about to wait for a capturing stream's work (a stream
// synchronisation, an inline launch): invalidates its capture and returns
// mydevErrorStreamCaptureUnsupported.
mydevError_t refuseCapturedWait(const mydevStream_st& stream);
// A host call about to wait for all of `device`'s streams: refused as above
// when a global (or this thread's thread-local) capture is active on it.
mydevError_t checkDeviceWait(int device);
// mydevEventSynchronize / Query on a record made during a capture.
mydevError_t refuseCapturedEvent(const EventMarker& marker);

}  // namespace mydev_detail

#endif  // MYDEV_RUNTIME_INTERNAL_H
