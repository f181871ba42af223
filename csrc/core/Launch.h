#pragma once
// Every kernel reaches the device through the runtime's launch entry points, on
// the current stream, so the runtime decides when and where device memory is
// touched (and, inside a kernel, it is touched at kernel addresses: see
// kernel_address).
//
// launch_async: the kernel is queued and runs later on the stream's worker. The
//   task keeps what it touches valid until it has run: it holds references,
//   or leases on blocks of its own stream (KernelArgs.h), which the allocator
//   may hand to later work on that stream but never gives back while queued. A failure is recorded with the op's name
//   and raised at the next synchronisation, as CUDA reports kernel errors.
//   The task is destroyed on a host thread, not on the worker (see
//   reap_finished_kernels).
// launch_inline: the kernel runs now, on this thread, after all work queued on
//   the stream: for kernels whose output shapes are only known by running them
//   (host kernels). Its exception propagates directly.
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <mydev_emulator.h>  // kernels are host functions: a port rewrites this file
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "ComputeUnits.h"
#include "Device.h"
#include "Exception.h"
#include "Graph.h"
#include "KernelArgs.h"
#include "Stream.h"

// A kernel run at the call (launch_if_idle) sits under every frame between the
// op and its body, and a frame costs more around a kernel than around a small
// function: a do-nothing frame around a CPU sum of 64 floats cost 5-6 ns,
// around a trivial function 1.4 ns (bench/bench_call_depth.py). Taking eight
// of ours out of a short sum's path (nine frames above its kernel to one) cut
// 50-90 ns of its 1.1 us, from 1.13-1.16x CPU's time to 1.05-1.09x. So the
// bodies launch_if_idle runs, and the functions on the way to it, are inlined
// into their callers: MYDEV_ALWAYS_INLINE on functions, MYDEV_INLINE_BODY after
// a lambda's parameter list; and the body runs in a runtime caller task, under
// the op's own frame. (The runtime, which includes nothing of this layer, has
// its own copy of the macro: src/internal.h.)
#if defined(__GNUC__)
#define MYDEV_ALWAYS_INLINE inline __attribute__((always_inline))
#define MYDEV_INLINE_BODY __attribute__((always_inline))
#else
#define MYDEV_ALWAYS_INLINE inline
#define MYDEV_INLINE_BODY
#endif

namespace my_device {

// Stores the failure of an asynchronous kernel on `device` until a
// synchronisation reports it (raise_runtime_error takes the oldest).
void record_kernel_failure(c10::DeviceIndex device, const char* label, const std::string& what,
                           ErrorKind kind = ErrorKind::Runtime);
// After a host read that waited for `device`'s streams (a synchronous copy to
// the host, .item()): raises the failure of a kernel queued before it, as a
// synchronisation would, since the bytes read may be the failed kernel's. As
// cudaMemcpy returns an earlier kernel's error. Costs one atomic load if none.
void raise_kernel_failure_after_host_read(c10::DeviceIndex device);
// Warnings of queued kernels. A CPU kernel's TORCH_WARN run on a stream worker
// would go to that thread's handler, which prints to stderr: past Python's
// `warnings` filters, catch_warnings and pytest. So workers keep them, and a
// host thread raises them again (same message and source location) when it
// next launches or synchronises; inside a Python call they become Python
// warnings there. Any host thread may be the one that raises them, as with
// CUDA's device-wide sticky errors.
void raise_kernel_warnings();
// After a host thread waited for the device (a synchronisation): destroys the
// finished tasks, raises their warnings, then raises `err` if it is a failure.
void finish_host_wait(mydevError_t err);
// torch.mydev.set_sync_debug_mode, as torch.cuda's: 0 says nothing, 1 warns
// and 2 raises when an operation makes the host wait for the device (a
// synchronous copy to or from the host, .item(), a kernel run at the call).
// Explicit synchronisations are not reported.
void set_sync_debug_mode(int mode);
int sync_debug_mode();
void warn_or_error_on_sync();
// While it lives, this thread's waits are not reported by the sync debug mode:
// for waits that are the emulator's own and that a GPU backend would not make
// (a host kernel's first run of a call signature, which makes the CPU kernel's
// checks at the call: see Signature in native/hostkernel/MetaCache.h).
class UnreportedSync {
 public:
  UnreportedSync();
  ~UnreportedSync();
  UnreportedSync(const UnreportedSync&) = delete;
  UnreportedSync& operator=(const UnreportedSync&) = delete;

 private:
  bool previous_;
};
// Test hook: the next launch_async whose label equals `label` fails when it runs.
void inject_kernel_failure(const std::string& label);
bool take_injected_failure(const char* label);

// The kernel this thread is running, if any: a launched task on a stream
// worker, or the body of a launch_inline on a host thread. Such a thread must
// not wait for its stream (the stream waits for it). `epoch` is the device
// allocator's free clock when the kernel took its place in the stream (see
// free_clock): what the allocator may give back to the runtime meanwhile.
struct KernelContext {
  c10::DeviceIndex device;
  mydevStream_t stream;
  uint64_t epoch;
  bool at_call;  // run by launch_if_idle on the launching thread (launch_is_nested)
  int threads;   // its intra-op threads (kernel_intra_op_threads), set while it runs
};
const KernelContext* current_kernel();
inline bool in_kernel() {
  return current_kernel() != nullptr;
}
// Marks this thread as running `kernel` for its lifetime, with the kernel's
// intra-op threads. A kernel run from inside another (an inline call from a
// queued task) keeps the outer context: its place in the stream is the outer one's.
class KernelScope {
 public:
  explicit KernelScope(const KernelContext& kernel);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  bool entered_;
  std::optional<IntraOpThreads> threads_;
};
// The context of a kernel about to take its place on `device`'s current stream
// (`stream`, if the caller has it already).
KernelContext kernel_context(c10::DeviceIndex device);
KernelContext kernel_context(c10::DeviceIndex device, mydevStream_t stream);

// Inside a kernel, device memory is reached at its kernel address: in strict
// mode a device address is inaccessible to all host code, kernels included,
// so that a host read faults whatever kernels are running (mydev_runtime.h);
// outside strict mode the two are the same.
inline bool strict_mode() {
  static const bool strict = mydevStrictMode() != 0;  // fixed at runtime start-up
  return strict;
}
// Under MYDEV_LAUNCH_BLOCKING every launch runs at the call, so a kernel that
// would be queued with a job holding its arguments can run over the caller's
// own tensors instead, as a short one does (launch_if_idle).
inline bool launches_block() {
  static const bool blocking = mydevLaunchBlocking() != 0;  // fixed at runtime start-up
  return blocking;
}
template <class T>
T* kernel_address(T* ptr) {
  return static_cast<T*>(mydevKernelAddress(ptr));
}

struct LaunchedTask {
  virtual ~LaunchedTask() = default;
  LaunchedTask* next_retired = nullptr;
};

// A finished task may hold the last reference to a tensor whose Python object
// it now owns; releasing that needs the GIL, which a host thread blocked in a
// synchronisation may hold. So workers only park finished tasks here, and host
// threads destroy them: on every launch, after synchronisations, and before the
// allocator reports statistics or gives up on an allocation.
void retire_kernel(LaunchedTask* task);
void reap_finished_kernels();
bool has_finished_kernels();
// The worker's warning handler while a queued kernel runs (see raise_kernel_warnings).
c10::WarningHandler* kernel_warning_collector();

// A kernel over at most this many elements is short: on an idle stream the
// runtime may run it at once on the calling thread rather than hand it to the
// stream's worker (mydevLaunchShortTask), which costs more than such a kernel.
constexpr int64_t kShortKernelElements = 4096;
inline bool is_short_kernel(int64_t elements) {
  return elements <= kShortKernelElements;
}

// Runs a kernel's body as a stream's task does: inside its kernel context,
// with a failure recorded, with the op's label, for the next synchronisation.
// Returns the task's status. On a stream's worker (kOnWorker) its warnings are
// kept for a host thread; a body run on the launching host thread warns there.
template <bool kOnWorker, class F>
MYDEV_ALWAYS_INLINE int run_kernel_body(const KernelContext& context, c10::DeviceIndex device, const char* label, F& body) {
  try {
    KernelScope in_kernel(context);
    std::optional<c10::WarningUtils::WarningHandlerGuard> keep_warnings;
    if constexpr (kOnWorker) keep_warnings.emplace(kernel_warning_collector());
    if (take_injected_failure(label)) {
      throw std::runtime_error("injected failure (my_device._C._test_inject_kernel_failure)");
    }
    body();
    return 0;
  } catch (const c10::Error& e) {
    record_kernel_failure(device, label, e.what_without_backtrace(), error_kind(e));
  } catch (const std::exception& e) {
    record_kernel_failure(device, label, e.what());
  }
  return 1;
}

// After a launch returned `err`. Under MYDEV_LAUNCH_BLOCKING the kernel ran and
// a failure is reported here; its warnings are raised by the call that ran it.
void finish_launch(c10::DeviceIndex device, mydevError_t err);

// Whether a launch onto `device`'s `stream` comes from inside a kernel that
// launch_if_idle runs at the call on that stream. Such a kernel is CPU code
// (a structured impl() over the caller's device tensors) that may call ops on
// device tensors itself: the CPU's sum zeroes its output with fill_(), addmm
// copies its bias into its output with copy_(), a softmax makes its input
// contiguous. It reads their results as soon as they return, as on the CPU;
// queued, they would run after the kernel that needs them. So the launches of
// such nested calls run at once, inside the calling kernel, which holds the
// stream: nothing queued can come between. A failure propagates to the
// calling kernel, which reports it under its own name.
inline bool launch_is_nested(c10::DeviceIndex device, mydevStream_t stream) {
  const KernelContext* k = current_kernel();
  return k != nullptr && k->at_call && k->device == device && k->stream == stream;
}

// What a queued kernel's own CPU calls see, whichever thread runs it: its
// stream's worker, or a host thread (at the call when short, or while waiting
// for the stream, which it then drains; the runtime README's "Waiting hosts run
// the queue").
//  - Dispatch keys: none beyond a fresh thread's. A waiting host may be inside
//    a TorchDispatchMode, a CPU autocast region or a dispatch-key guard, which
//    must not reach them (they would go to Python, or be cast): they then get
//    a fresh thread's keys, below autograd, as a CPU kernel's own calls
//    normally run. Keys that only exclude more (the op's autograd kernel's, at
//    the call) are kept.
//  - No RecordFunction for the profiling thread: its profiler must not show
//    those calls as host ops of whatever it is doing then (a `fill_` under a
//    synchronisation); they are the kernel's device work.
// Each is changed only where needed. Forcing both on every kernel cost a short
// foreach op at the call 0.3-0.4 us: turning RecordFunction off and on makes
// PyTorch rebuild the thread's callback lists, and asking for global callbacks
// too (at::hasCallbacks) takes a lock.
class KernelThreadState {
 public:
  KernelThreadState() : saved_keys_(c10::impl::tls_local_dispatch_key_set()) {
    keys_changed_ = !c10::default_included_set.isSupersetOf(saved_keys_.included_) ||
                    !saved_keys_.excluded_.isSupersetOf(c10::default_excluded_set);
    if (C10_UNLIKELY(keys_changed_)) {
      c10::impl::LocalDispatchKeySet keys = saved_keys_;
      keys.included_ = c10::default_included_set;
      keys.excluded_ = c10::default_excluded_set | c10::autograd_dispatch_keyset_with_ADInplaceOrView;
      c10::impl::_force_tls_local_dispatch_key_set(keys);
    }
    if (C10_UNLIKELY(at::hasThreadLocalCallbacks())) no_record_functions_.emplace();
  }
  ~KernelThreadState() {
    if (C10_UNLIKELY(keys_changed_)) c10::impl::_force_tls_local_dispatch_key_set(saved_keys_);
  }
  KernelThreadState(const KernelThreadState&) = delete;
  KernelThreadState& operator=(const KernelThreadState&) = delete;

 private:
  c10::impl::LocalDispatchKeySet saved_keys_;
  bool keys_changed_;
  std::optional<at::DisableRecordFunctionGuard> no_record_functions_;
};

// `short_kernel`: see kShortKernelElements. Either way errors are reported at
// the next synchronisation. `touches`: the job's KernelArgs, when the body
// reaches device memory through it only; a captured launch declares that
// memory, so replays may run it beside kernels that touch other memory.
template <class F>
void launch_async(c10::DeviceIndex device, const char* label, F&& body, bool short_kernel = false,
                  const KernelArgs* touches = nullptr) {
  struct Task final : LaunchedTask {
    Task(F&& b, c10::DeviceIndex d, mydevStream_t stream, const char* l)
        : body(std::forward<F>(b)), device(d), label(l), context(kernel_context(d, stream)) {}
    std::decay_t<F> body;
    c10::DeviceIndex device;
    const char* label;
    KernelContext context;
  };
  const mydevStream_t stream = current_stream_handle(device);
  if (launch_is_nested(device, stream)) {
    body();
    return;
  }
  reap_finished_kernels();
  auto* task = new Task(std::forward<F>(body), device, stream, label);
  if (C10_UNLIKELY(capture_underway()) && stream_capturing(stream)) {
    // Captured: the graph runs the task at each replay and keeps it until it
    // is destroyed (on a host thread: the graph's reset).
    auto replayed = [](void* data) -> int {
      auto* t = static_cast<Task*>(data);
      KernelThreadState kernel_state;
      return run_kernel_body<true>(t->context, t->device, t->label, t->body);
    };
    const mydevError_t err = mydevLaunchHostFuncEx(stream, replayed, task, label, 0u);
    if (err != mydevSuccess) {
      delete task;
      finish_launch(device, err);  // raises: the capture was invalidated
      return;
    }
    MYDEV_CHECK(mydevStreamCaptureRetainObject(stream, task, [](void* t) { delete static_cast<Task*>(t); }));
    if (const auto* memory = touches != nullptr ? touches->captured_memory() : nullptr) {
      c10::SmallVector<mydevMemRange, 4> ranges;
      for (const auto& range : *memory) ranges.push_back({range.ptr, range.bytes, range.written ? 1 : 0});
      MYDEV_CHECK(mydevStreamCaptureDeclareMemory(stream, ranges.data(), ranges.size()));
    }
    return;
  }
  auto trampoline = [](void* data) -> int {
    auto* t = static_cast<Task*>(data);
    KernelThreadState kernel_state;
    // A short task may run on the launching thread (mydevLaunchShortTask); its
    // warnings are kept all the same, as the launch cannot tell.
    const int status = run_kernel_body<true>(t->context, t->device, t->label, t->body);
    retire_kernel(t);
    return status;
  };
  // (`stream` names `device`'s stream whatever the runtime's current device: Stream.h.)
  const mydevError_t err =
      mydevLaunchHostFuncEx(stream, trampoline, task, label, short_kernel ? mydevLaunchShortTask : 0u);
  if (err != mydevSuccess && err != mydevErrorLaunchFailure) delete task;  // not enqueued
  finish_launch(device, err);
}

// Whether `device`'s current stream has nothing queued or running: a hint for
// launch_if_idle's callers, which decide by it whether to prepare a kernel
// that reads their own arguments (the launch itself decides).
// A launch nested in a kernel run at the call finds it idle: launch_if_idle
// then runs it at once (launch_is_nested, asked only of a busy stream).
inline bool stream_idle(c10::DeviceIndex device) {
  const mydevStream_t stream = current_stream_handle(device);
  return mydevStreamQuery(stream) == mydevSuccess || launch_is_nested(device, stream);
}

// A short kernel (kShortKernelElements) that runs now, on this thread, if
// `device`'s current stream is idle, and otherwise runs nothing and returns
// false. `body` may read the caller's own arguments, which a queued task would
// have to copy and hold (a job, KernelArgs.h): on an idle stream that costs
// more than the kernel. Failures are reported at the next synchronisation, as
// a queued kernel's.
template <class F>
MYDEV_ALWAYS_INLINE bool launch_if_idle(c10::DeviceIndex device, const char* label, F&& body) {
  reap_finished_kernels();
  const mydevStream_t stream = current_stream_handle(device);
  // A caller task, not a launch of a function pointer: the body runs here,
  // under the op's own frame (see MYDEV_ALWAYS_INLINE).
  mydevCallerTask task;
  const mydevError_t begun = mydevStreamBeginCallerTask(stream, &task);
  if (begun == mydevErrorNotReady) {
    // (The stream is busy with the kernel this one is nested in, if any:
    // asked here, off the idle path.)
    if (!launch_is_nested(device, stream)) return false;
    body();
    return true;
  }
  if (C10_UNLIKELY(begun != mydevSuccess)) {
    finish_launch(device, begun);  // raises
    return true;
  }
  KernelContext context = kernel_context(device, stream);
  context.at_call = true;
  // Ends the task if the body throws what run_kernel_body does not catch (a
  // forced unwind): the stream must not stay taken.
  struct EndOnUnwind {
    mydevCallerTask* task;
    const char* label;
    ~EndOnUnwind() {
      if (task) mydevStreamEndCallerTask(task, 1, label);
    }
  } unwind{&task, label};
  const int status = run_kernel_body<false>(context, device, label, body);  // always on this thread
  unwind.task = nullptr;
  finish_launch(device, mydevStreamEndCallerTask(&task, status, label));
  return true;
}

template <class F>
void launch_inline(c10::DeviceIndex device, F&& body) {
  // (It waits for the stream, unless called from a kernel, which waits for nothing.)
  if (!in_kernel()) {
    raise_kernel_warnings();
    warn_or_error_on_sync();
  }
  struct Closure {
    F* body;
    std::exception_ptr error;
    KernelContext context;
  } closure{&body, nullptr, kernel_context(device)};
  auto trampoline = [](void* data) -> int {
    auto* c = static_cast<Closure*>(data);
    try {
      KernelScope in_kernel(c->context);
      (*c->body)();
      return 0;
    } catch (...) {
      c->error = std::current_exception();
      return 1;
    }
  };
  const mydevError_t err = mydevLaunchHostFuncInline(current_stream_handle(device), trampoline, &closure);
  if (closure.error) {
    std::rethrow_exception(closure.error);
  }
  TORCH_CHECK(err != mydevErrorStreamCaptureUnsupported,
              "mydev error: operation not permitted when stream is capturing (this op runs on the host, in "
              "stream order: its output depends on the data, or this is the first call with these argument "
              "types, whose checks run at the call; run the code once before capturing it)");
  if (err != mydevSuccess) {
    RuntimeDeviceGuard on_device(device);  // see finish_launch
    MYDEV_CHECK(err);
  }
}

} // namespace my_device
