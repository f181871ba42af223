/*
 * mydev_emulator.h: what only the emulated device offers, beyond the driver API
 * of mydev_runtime.h.
 *
 * On the emulator a kernel is a host function run by a stream's worker thread
 * on host-addressable device memory. These calls serve that model: launching
 * with flags that let a short kernel run at the call, the calling thread
 * running a task itself, a task's work shared among compute units or run as a
 * team of threads that wait for each other, inline launches in stream order,
 * kernel addresses and strict mode, the launch-blocking query, a wait that
 * leaves errors pending, and a test hook. A real driver has no counterpart for
 * them; a port does not implement this header but rewrites the integration
 * files that use it (docs/porting.md lists them: csrc/core/Launch.h,
 * csrc/core/Allocator.cpp, csrc/core/ComputeUnits.cpp,
 * csrc/native/hostkernel/HostCall.cpp, csrc/Module.cpp, and
 * my_device/inductor/kernel_team.h, which finds the team calls at run time).
 */
#ifndef MYDEV_EMULATOR_H
#define MYDEV_EMULATOR_H

#include "mydev_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- waits ------------------------------------------------------------ */
/* Waits as mydevDeviceSynchronize does, but leaves pending launch failures for
 * the next synchronisation (as CUDA's stay sticky): for a host that must know
 * earlier work has run, without taking its errors (a change of a setting that
 * kernels read when they run). */
MYDEV_API mydevError_t mydevDeviceWaitIdle(void);

/* ---- launches --------------------------------------------------------- */
/* The same, with flags. mydevLaunchShortTask says fn is short (a kernel over a
 * few thousand elements): when the stream is idle (nothing queued or running,
 * no test delay) the runtime may run it at once on the calling thread, in
 * stream order, instead of handing it to the worker. For a short task the
 * hand-off costs more than the task, and its cost depends on where the two
 * threads run (see stream.cpp). Everything else is as for a queued launch: a
 * failure is the stream's sticky error, reported by the next synchronisation,
 * and the launch returns mydevSuccess. */
#define mydevLaunchShortTask 0x1u
/* With mydevLaunchShortTask: run fn on the calling thread if the stream is
 * idle, and otherwise enqueue nothing and return mydevErrorNotReady. For
 * callers whose fn reads the caller's own arguments, which a queued task could
 * not (they would build a task that holds its own copies instead). Ignored
 * under MYDEV_LAUNCH_BLOCKING, where every launch runs at the call. */
#define mydevLaunchIdleOnly 0x2u
MYDEV_API mydevError_t mydevLaunchHostFuncEx(mydevStream_t stream, mydevHostFn_t fn, void* user_data,
                                             const char* label, unsigned int flags);
/* During stream capture: all the device memory (device addresses) that the
 * launch just captured on `stream` reads or writes. A replay orders declared
 * launches by the memory they share, not by capture order, and runs those
 * that share none on separate threads at once, as a device runs independent
 * kernels side by side: MYDEV_COMPUTE_UNITS=N (N > 1) always does with
 * N threads, 1 never does; unset, two threads do when the first replay, run in
 * capture order and timed, finds the nodes long enough and the longest path
 * through them at most 0.9 of their total time. A range declared read-only
 * (written == 0) orders the node only against nodes that write it. Captured
 * copies and memsets are declared by the runtime. A launch left undeclared
 * runs after every node captured before it and before every node captured
 * after it. mydevErrorIllegalState
 * if the stream is not capturing or its last captured node is not a launch of
 * its own. */
typedef struct mydevMemRange {
  const void* ptr;
  size_t bytes;
  int written; /* nonzero if the node may write any of it */
} mydevMemRange;
MYDEV_API mydevError_t mydevStreamCaptureDeclareMemory(mydevStream_t stream, const mydevMemRange* ranges,
                                                      size_t count);
/* Inside a launched function: runs fn(user_data) on the calling thread and, at
 * the same time, once on each of the device's other compute units that is
 * free, each running as the launched function does (same stream and device);
 * returns when every call has returned. A device has MYDEV_COMPUTE_UNITS units
 * (2 by default, the stream's worker among them); replays share them too
 * (see above), and a unit runs one task's work at a time, so fn may run only
 * once. fn divides its work among however many calls there are, as a GPU
 * kernel divides its work among the blocks it is given, and must not throw.
 * Outside a launched function fn runs once, on the calling thread. */
MYDEV_API mydevError_t mydevRunOnComputeUnits(void (*fn)(void* user_data), void* user_data);
/* Inside a launched function: runs fn(user_data) as a team of `size` team
 * threads that may wait for each other (mydevTeamBarrier), as the blocks of a
 * cooperative GPU kernel synchronise across its grid. Team thread 0 runs on the
 * calling thread; each other one on a free compute unit that takes it or, if
 * none has by the time thread 0 first waits (or returns), on the calling
 * thread too, switched to at each wait. A team thread sees its own index and
 * the team's size whichever thread runs it, so what a team computes never
 * depends on how many units it got. Returns when every team thread has
 * returned; outside a launched function the calling thread runs them all. fn
 * must not throw, and every team thread must reach the same waits.
 * mydevErrorInvalidValue for a null fn or a size outside 1..64. */
MYDEV_API mydevError_t mydevRunTeam(void (*fn)(void* user_data), void* user_data, int size);
/* In a team thread: its index and its team's size; 0 and 1 elsewhere. */
MYDEV_API int mydevTeamThread(void);
MYDEV_API int mydevTeamSize(void);
/* In a team thread: returns once every thread of the team has reached it
 * (returns at once elsewhere). */
MYDEV_API void mydevTeamBarrier(void);
/* In a team thread: nonzero for exactly one of the team's threads at each of
 * their k-th calls, for a block one of them runs (OpenMP's `single`); nonzero
 * elsewhere. */
MYDEV_API int mydevTeamSingle(void);
/* Team threads run so far on a unit other than their team's calling thread
 * (`elsewhere`) and on the calling thread besides its own (`switched`). */
MYDEV_API mydevError_t mydevGetTeamCounts(unsigned long long* elsewhere, unsigned long long* switched);
/* The device's compute units (MYDEV_COMPUTE_UNITS, 2 unset), and whether the
 * count was asked for (the variable is set). A caller that schedules its own
 * independent work on them follows the rule replays follow: asked for, always
 * side by side (count > 1) or never (count == 1); not asked for, its own
 * timed run decides. */
MYDEV_API mydevError_t mydevGetComputeUnits(int* count, int* asked);
/* Nonzero when MYDEV_LAUNCH_BLOCKING=1, where every launch, copy and memset
 * runs at the call: a caller that would build a task holding its own copies of
 * its arguments (for a worker to run later) may run the work over them. */
MYDEV_API int mydevLaunchBlocking(void);
/* A short task the calling thread runs itself, without a function pointer:
 * mydevStreamBeginCallerTask takes the stream if it is idle (as
 * mydevLaunchShortTask | mydevLaunchIdleOnly would run fn), the caller runs the
 * task, and mydevStreamEndCallerTask completes it. In between, the caller is
 * the stream's work as a launched function is (the stream's device is current,
 * work it enqueues on the stream runs after it, synchronising the stream does
 * not wait for it), and it must end the task on the same thread. For callers
 * whose task runs under a deep call chain of its own, where every frame above
 * it (a launch's, a trampoline's) costs several times what it costs elsewhere.
 * Begin returns mydevErrorNotReady, and begins nothing, if the stream is busy
 * (or the caller is the stream's own work). End reports `failed` (non-zero) as
 * a short task's failure: the stream's sticky error, and also its return value
 * under MYDEV_LAUNCH_BLOCKING. The struct is the runtime's; callers only
 * provide its storage. */
typedef struct mydevCallerTask {
  unsigned long long opaque[8];
} mydevCallerTask;
MYDEV_API mydevError_t mydevStreamBeginCallerTask(mydevStream_t stream, mydevCallerTask* task);
MYDEV_API mydevError_t mydevStreamEndCallerTask(mydevCallerTask* task, int failed, const char* label);

/* Runs fn now, on the calling thread, in stream order: after all work already
 * enqueued on the stream has run, while the stream's worker waits (work
 * enqueued meanwhile runs after fn). fn runs as a launched function would: the
 * stream's device is the current device, and it reaches device memory through
 * mydevKernelAddress. For
 * work whose results the host needs at once (e.g. kernels whose output sizes
 * depend on the data). Returns mydevErrorLaunchFailure if fn fails, without
 * setting the stream's sticky error: the caller already has the failure.
 * Inside fn the rules for launched functions apply (synchronising the stream
 * does not wait for fn; work fn enqueues on the stream runs after it). */
MYDEV_API mydevError_t mydevLaunchHostFuncInline(mydevStream_t stream, mydevHostFn_t fn, void* user_data);

/* TEST ONLY, not for production code: makes the stream's worker sleep this
 * many microseconds before starting each task (0 turns it off), so tests can
 * observe asynchrony deterministically. */
MYDEV_API mydevError_t mydevTestSetStreamDelay(mydevStream_t stream, unsigned microseconds);

/* ---- strict mode ------------------------------------------------------ */
/* With MYDEV_STRICT=1 each device allocation has two addresses for the same
 * bytes. Its device address (what mydevMalloc returns, what every runtime call
 * takes, what the integration stores in tensors) is PROT_NONE for the
 * allocation's whole life: any thread that dereferences it, a launched
 * function included, gets SIGSEGV, reported with the address and allocation
 * ("host code accessed device memory at ...") before the process aborts. This
 * holds while kernels and copies run, so host reads of device memory are
 * caught even when the device is never idle. Its kernel address is a second,
 * read-write mapping of the same memory: launched functions (and inline
 * functions) read and write device memory only through it, and the runtime's
 * copies and memsets use it internally. Outside strict mode the two are equal
 * and translating costs one branch.
 *
 * Kernel addresses are host memory to the rest of the API: reported by
 * mydevPointerGetAttributes as mydevMemoryTypeUnregistered, not accepted by
 * mydevFree, rejected as the device side of a copy or memset
 * (mydevErrorInvalidDevicePointer: runtime calls take device addresses), and
 * accepted as the host side (a kernel may copy device memory into its own
 * kernel view). The last is strict mode only: elsewhere a kernel address is
 * the device address, and the copy fails with mydevErrorInvalidHostPointer,
 * so portable code copies between device ranges with device addresses and
 * mydevMemcpyDeviceToDevice. A kernel address is valid exactly as long as its
 * allocation. After mydevFree both addresses stay reserved (inaccessible, no
 * memory) until 256 more allocations have been freed: an access through
 * either faults and is reported as a use after free ("freed device memory
 * accessed at ..."); later the ranges are unmapped and may be reused. Host code
 * could read device memory through a kernel address too: by convention only
 * launched and inline functions translate.
 *
 * A child forked after allocating (already unable to use the runtime) inherits
 * neither mapping in strict mode: touching either address there faults, and
 * the child can neither see nor change the parent's device memory. */
MYDEV_API int mydevStrictMode(void); /* nonzero when MYDEV_STRICT=1 */
/* Device address -> the kernel address of the same byte. ptr may point
 * anywhere inside a live device allocation or one past its requested size;
 * anything else (NULL, host or pinned memory, freed memory, the page-rounding
 * tail) is returned unchanged, and so is every pointer outside strict mode.
 * One past the end always translates to one past the end of the kernel view
 * (no other mapping starts there), so begin and end pointers may be translated
 * separately. A kernel address is never also a device address, so a kernel
 * address is returned unchanged (the call is idempotent). Thread safe (a lock
 * and a map lookup in strict mode); never
 * initialises the runtime; returns ptr unchanged in a child forked after
 * initialisation. */
MYDEV_API void* mydevKernelAddress(const void* ptr);
/* The inverse: kernel address (inside a live allocation's kernel view, or one
 * past its requested size) -> device address; anything else unchanged, as is
 * every pointer outside strict mode; idempotent likewise.
 * mydevDeviceAddress(mydevKernelAddress(p)) == p for every p inside a live
 * device allocation or one past its end. */
MYDEV_API void* mydevDeviceAddress(const void* ptr);

#ifdef __cplusplus
}
#endif
#endif /* MYDEV_EMULATOR_H */
