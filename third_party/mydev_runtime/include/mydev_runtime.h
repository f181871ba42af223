/*
 * mydev_runtime: the emulated accelerator's driver API.
 *
 * This header is the contract between the device and everything above it (the
 * PyTorch integration in csrc/), in calls a real driver has too (each maps to
 * a CUDA runtime call: docs/porting.md). It has no PyTorch dependency. What
 * only an emulator can offer (kernels that are host functions run at the
 * call, kernel addresses, strict mode, test hooks) is in mydev_emulator.h, and
 * the few integration files that include it are the ones a port rewrites.
 *
 * Conventions, modelled on the CUDA runtime so integration code reads familiarly:
 *  - every call returns a mydevError_t; mydevSuccess is 0;
 *  - the current device is per thread and starts at 0;
 *  - a NULL mydevStream_t means the default stream of the current device
 *    (mydevDeviceGetDefaultStream names one whatever device is current);
 *  - device pointers (device addresses) name device memory to the runtime and
 *    are never dereferenced by the host. Launched functions reach the memory
 *    through mydevKernelAddress(p) (mydev_emulator.h);
 *  - execution is asynchronous, as on a GPU: each stream has a worker thread
 *    that runs its work in FIFO order, and the *Async calls, launches, event
 *    records and stream waits only enqueue (see "streams" below).
 *  - all calls are thread safe; any number of threads may use one stream.
 *
 * Environment (read once, at first use):
 *  MYDEV_DEVICE_COUNT     number of devices (default 2)
 *  MYDEV_MEMORY_LIMIT     capacity per device, bytes or with K/M/G/T suffix (default 8G)
 *  MYDEV_STRICT           1: any code dereferencing a device address faults loudly
 *  MYDEV_LAUNCH_BLOCKING  1: every enqueue returns only once its work has run
 *                         (a failing launch then returns mydevErrorLaunchFailure
 *                         itself, besides leaving the sticky error); for debugging
 *  MYDEV_LAUNCH_QUEUE_DEPTH  how many tasks a stream holds queued but not yet
 *                         started before an enqueue waits for room (default
 *                         1024, like CUDA's launch queue; 0: no limit)
 */
#ifndef MYDEV_RUNTIME_H
#define MYDEV_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MYDEV_API __attribute__((visibility("default")))
#else
#define MYDEV_API
#endif

typedef enum mydevError {
  mydevSuccess = 0,
  mydevErrorInvalidValue = 1,         /* bad argument: null out-pointer, bad flags, bad kind */
  mydevErrorMemoryAllocation = 2,     /* the device is out of memory */
  mydevErrorInvalidDevice = 3,        /* device index out of range */
  mydevErrorInvalidDevicePointer = 4, /* pointer is not (inside) a live device allocation */
  mydevErrorNotReady = 5,             /* query: work still pending */
  mydevErrorInvalidResourceHandle = 6,/* stream or event handle not valid */
  mydevErrorInitializationError = 7,  /* used in a child process after fork */
  mydevErrorLaunchFailure = 8,        /* a launched function reported failure */
  mydevErrorTimingDisabled = 9,       /* elapsed time asked of an event without timing */
  mydevErrorInvalidHostPointer = 10,  /* host side of a copy is device memory, or unknown pinned ptr */
  /* Stream capture (see "graphs" below), named as CUDA names them: */
  mydevErrorStreamCaptureUnsupported = 11, /* the call would wait for work a capture records */
  mydevErrorStreamCaptureInvalidated = 12, /* an earlier error ended the capture's usefulness */
  mydevErrorStreamCaptureUnjoined = 13,    /* a stream forked from the capture was never joined back */
  mydevErrorStreamCaptureIsolation = 14,   /* a captured stream waited for work outside the capture */
  mydevErrorStreamCaptureUnmatched = 15,   /* ending a capture on a stream that did not begin it */
  mydevErrorStreamCaptureWrongThread = 16, /* ending a thread-local capture from another thread */
  mydevErrorCapturedEvent = 17,            /* waiting on or querying an event recorded in a capture */
  mydevErrorIllegalState = 18,             /* capture begun twice, graph launched into a capture */
} mydevError_t;

MYDEV_API const char* mydevGetErrorName(mydevError_t error);
MYDEV_API const char* mydevGetErrorString(mydevError_t error);

/* ---- devices ---------------------------------------------------------- */
typedef struct mydevDeviceProp {
  char name[64];
  size_t totalGlobalMem;     /* MYDEV_MEMORY_LIMIT */
  int multiProcessorCount;   /* host hardware threads */
  int major, minor;          /* "compute capability" of the emulated device */
} mydevDeviceProp;

MYDEV_API mydevError_t mydevGetDeviceCount(int* count);   /* never initialises, works after fork */
MYDEV_API mydevError_t mydevGetDevice(int* device);        /* per thread */
MYDEV_API mydevError_t mydevSetDevice(int device);
MYDEV_API mydevError_t mydevGetDeviceProperties(mydevDeviceProp* prop, int device);
/* Waits for all work enqueued on any stream of the current device, then returns
 * (and clears) one pending launch failure among them; the others are left for
 * later synchronisations. */
MYDEV_API mydevError_t mydevDeviceSynchronize(void);
/* Nonzero once the runtime has been used in this process (first call other than
 * GetDeviceCount/GetErrorName/GetErrorString). Lets the integration decide lazily. */
MYDEV_API int mydevIsInitialized(void);

/* ---- device memory ---------------------------------------------------- */
MYDEV_API mydevError_t mydevMalloc(void** ptr, size_t size);  /* current device; size 0 gives NULL */
/* NULL is a no-op. Does not wait for pending work: memory that queued copies
 * or launches still use must be kept alive by the caller until they ran. */
MYDEV_API mydevError_t mydevFree(void* ptr);
MYDEV_API mydevError_t mydevMemGetInfo(size_t* free_bytes, size_t* total_bytes); /* current device */

typedef enum mydevMemoryType {
  mydevMemoryTypeUnregistered = 0, /* plain host memory the runtime does not know */
  mydevMemoryTypeHost = 1,         /* pinned host memory from mydevHostAlloc */
  mydevMemoryTypeDevice = 2,
} mydevMemoryType;

typedef struct mydevPointerAttributes {
  mydevMemoryType type;
  int device;        /* device of a device pointer, -1 otherwise */
  void* base;        /* start of the allocation holding the pointer, NULL if unregistered */
  size_t size;       /* size of that allocation */
} mydevPointerAttributes;

MYDEV_API mydevError_t mydevPointerGetAttributes(mydevPointerAttributes* attr, const void* ptr);

/* ---- pinned host memory ----------------------------------------------- */
MYDEV_API mydevError_t mydevHostAlloc(void** ptr, size_t size);
MYDEV_API mydevError_t mydevFreeHost(void* ptr);

/* ---- streams ---------------------------------------------------------- */
/* A stream is a FIFO queue of work (launches, async copies and memsets, event
 * records and waits) run in order by the stream's worker thread, started at its
 * first enqueue. Enqueuing returns at once (unless MYDEV_LAUNCH_BLOCKING=1, or
 * the stream's launch queue is full: see "Launch queue" below); work on
 * different streams runs concurrently and is ordered only through events.
 * The default stream of each device is such a stream too, with no implicit
 * synchronisation with other streams (only the synchronous mydevMemcpy waits
 * for them).
 *
 * Errors: a failing launch (nonzero return, or a C++ exception escaping it)
 * makes mydevErrorLaunchFailure the stream's sticky error. Failures are kept in
 * order: mydevStreamSynchronize on that stream, or mydevDeviceSynchronize on its
 * device, returns the oldest unreported one and clears it, so a second failure
 * is reported by a second synchronisation. Later work on the stream still runs.
 *
 * Launched functions may call the runtime (allocate, copy, enqueue), but
 * synchronisation never waits for the calling function's own stream (it
 * cannot finish first), and mydevMemcpy copies at once without waiting.
 * At process exit, work still queued is dropped; a running task is given up
 * to a second to finish.
 *
 * Launch queue: like a GPU's, a stream's queue is bounded, so the host cannot
 * run arbitrarily far ahead of the device (queued work keeps its buffers in
 * use). A stream holds at most MYDEV_LAUNCH_QUEUE_DEPTH tasks that have not
 * started; an enqueue (launch, async copy or memset, event record, stream
 * wait) on a full stream waits until its worker has started tasks, down to
 * half the limit, then enqueues and returns. Exceptions, where waiting could
 * deadlock, enqueue past the limit at once instead: work enqueued from the
 * stream's own launched functions or from an inline function on it, and work
 * enqueued from another stream's functions while the full stream's worker is
 * itself waiting (for an event, another stream or an inline caller). A
 * launched function waiting for room in another stream counts as waiting for
 * priorities. A waiting enqueue fails with mydevErrorInvalidResourceHandle if
 * the stream is destroyed meanwhile, and at process exit it stops waiting and
 * runs its work in the calling thread, as any work enqueued after exit does. */
typedef struct mydevStream_st* mydevStream_t;

MYDEV_API mydevError_t mydevDeviceGetStreamPriorityRange(int* least, int* greatest);
/* Creates a stream on the current device. Lower numbers are higher priority, as in CUDA:
 * while a stream has queued work and is not waiting (for an event, an inline
 * caller or another stream), streams of lower priority on its device start no
 * new task. Running work is never pre-empted. No effect on launches, copies
 * and memsets under MYDEV_LAUNCH_BLOCKING=1, which run in the caller. */
MYDEV_API mydevError_t mydevStreamCreateWithPriority(mydevStream_t* stream, int priority);
/* Waits for the stream's queued work (its pending sticky error is discarded),
 * then destroys it. Enqueuing on it from other threads meanwhile fails with
 * mydevErrorInvalidResourceHandle. */
MYDEV_API mydevError_t mydevStreamDestroy(mydevStream_t stream);
/* The handle of `device`'s default stream: the stream NULL names while `device`
 * is current, but naming it whatever device is current, so a caller that knows
 * its device needs no device switch around a launch. Valid for the life of
 * the process; mydevStreamDestroy rejects it. Activity records still name a
 * default stream NULL. */
MYDEV_API mydevError_t mydevDeviceGetDefaultStream(int device, mydevStream_t* stream);
MYDEV_API mydevError_t mydevStreamGetDevice(mydevStream_t stream, int* device);
MYDEV_API mydevError_t mydevStreamGetPriority(mydevStream_t stream, int* priority);
/* Waits until all work enqueued on the stream before the call has run, then
 * returns (and clears) the stream's sticky error. */
MYDEV_API mydevError_t mydevStreamSynchronize(mydevStream_t stream);
/* mydevSuccess if all enqueued work has run, else mydevErrorNotReady. Does not
 * report or clear the sticky error. */
MYDEV_API mydevError_t mydevStreamQuery(mydevStream_t stream);

/* A launched function is the emulated device's kernel: it runs later, in stream
 * order, on the stream's worker thread, with the stream's device as that
 * thread's current device. It reads and writes device memory through kernel
 * addresses, mydevKernelAddress(p) for each device pointer p it is given
 * (required in strict mode, the identity otherwise); it passes device
 * addresses, not kernel addresses, back to runtime calls. user_data (and
 * anything it points to) must stay valid until it has run. It returns 0 on
 * success; anything else makes it a failed launch (see "Errors" above).
 * The launch itself returns mydevSuccess once the work is enqueued; under
 * MYDEV_LAUNCH_BLOCKING=1 it returns after fn ran, with
 * mydevErrorLaunchFailure if fn failed. */
typedef int (*mydevHostFn_t)(void* user_data);
MYDEV_API mydevError_t mydevLaunchHostFunc(mydevStream_t stream, mydevHostFn_t fn, void* user_data);
/* The same, naming the work (e.g. the operator) for error reports. The label
 * is copied at the call (its first MYDEV_MAX_LABEL_LENGTH bytes); NULL or ""
 * means none. Costs no more than an unlabelled launch. */
#define MYDEV_MAX_LABEL_LENGTH 95
MYDEV_API mydevError_t mydevLaunchHostFuncLabeled(mydevStream_t stream, mydevHostFn_t fn,
                                                  void* user_data, const char* label);
/* Copies into buf the label of the launch behind the stream's sticky error:
 * the failure pending for the next synchronisation or, once that reported it,
 * the most recently reported one (until a new failure replaces it). Writes ""
 * if the stream never had a failed launch or that launch had no label. The
 * label is truncated to len - 1 bytes and always NUL-terminated. Neither waits
 * nor clears anything; call it after a synchronisation returned
 * mydevErrorLaunchFailure. mydevErrorInvalidValue if buf is NULL or len is 0. */
MYDEV_API mydevError_t mydevStreamGetErrorLabel(mydevStream_t stream, char* buf, size_t len);

/* ---- copies ----------------------------------------------------------- */
typedef enum mydevMemcpyKind {
  mydevMemcpyHostToDevice = 1,
  mydevMemcpyDeviceToHost = 2,
  mydevMemcpyDeviceToDevice = 3, /* also across devices */
} mydevMemcpyKind;

/* Each device-side range must lie inside one live device allocation, and each
 * host-side range must not touch device memory (kernel addresses are host
 * memory here: see "strict mode"); otherwise the copy fails with
 * mydevErrorInvalidDevicePointer / mydevErrorInvalidHostPointer and copies
 * nothing. Ranges are checked when the call is made, async ones included. */

/* Synchronous: waits for all work already enqueued on every stream of the
 * current device and of the devices the ranges lie on (like CUDA's legacy
 * default stream, simplified), then copies and returns. Returns copy errors
 * only; a pending sticky launch error is left for the next synchronisation. */
MYDEV_API mydevError_t mydevMemcpy(void* dst, const void* src, size_t count, mydevMemcpyKind kind);
/* Enqueued on the stream (run at the call, MYDEV_LAUNCH_BLOCKING=1); host buffers must stay valid until it ran. */
MYDEV_API mydevError_t mydevMemcpyAsync(void* dst, const void* src, size_t count,
                                        mydevMemcpyKind kind, mydevStream_t stream);
MYDEV_API mydevError_t mydevMemsetAsync(void* dst, int value, size_t count, mydevStream_t stream);

/* ---- events ----------------------------------------------------------- */
typedef struct mydevEvent_st* mydevEvent_t;
enum { mydevEventDefault = 0x0, mydevEventDisableTiming = 0x2 };

MYDEV_API mydevError_t mydevEventCreateWithFlags(mydevEvent_t* event, unsigned int flags);
MYDEV_API mydevError_t mydevEventDestroy(mydevEvent_t event);
/* Enqueues a marker; the event completes (and takes its timestamp) when the
 * stream's worker reaches it. Re-recording makes the event incomplete again
 * and refers it to the new marker. */
MYDEV_API mydevError_t mydevEventRecord(mydevEvent_t event, mydevStream_t stream);
/* mydevSuccess if the latest record completed (or there was none), else mydevErrorNotReady. */
MYDEV_API mydevError_t mydevEventQuery(mydevEvent_t event);
/* Waits for the record current at the call; returns at once if never recorded. */
MYDEV_API mydevError_t mydevEventSynchronize(mydevEvent_t event);
/* Milliseconds between two recorded events; mydevErrorTimingDisabled if either lacks timing,
 * mydevErrorNotReady if either is not yet complete, mydevErrorInvalidResourceHandle if never recorded. */
MYDEV_API mydevError_t mydevEventElapsedTime(float* ms, mydevEvent_t start, mydevEvent_t end);
/* Work enqueued on `stream` after this call starts only once the event's record
 * current at this call has completed (any device); re-recording the event later
 * does not affect it. A never-recorded or already complete event: no-op. */
MYDEV_API mydevError_t mydevStreamWaitEvent(mydevStream_t stream, mydevEvent_t event);

/* ---- graphs ----------------------------------------------------------- */
/* Stream capture, as CUDA's. Between mydevStreamBeginCapture and
 * mydevStreamEndCapture a stream runs nothing: each launch, async copy and
 * memset enqueued on it becomes a node of a graph instead (its function,
 * user_data and label are kept, not called), and the enqueue returns
 * mydevSuccess. A short or idle-only launch (mydevLaunchShortTask,
 * mydevStreamBeginCallerTask) is never run at the call on a capturing stream:
 * idle-only ones return mydevErrorNotReady, so their callers launch instead.
 *
 * Other streams join a capture through events, as on CUDA: an event recorded
 * on a capturing stream records no node but the stream's position in the
 * graph; a stream that waits for it joins the capture from there (its later
 * work becomes nodes that depend on that position), and a capturing stream
 * that waits for an event recorded on a joined stream depends on that
 * stream's work so far. Every joined stream must be joined back into the
 * stream that began the capture before it ends (mydevErrorStreamCaptureUnjoined).
 *
 * While a capture is active, calls that would wait for captured work fail
 * with mydevErrorStreamCaptureUnsupported and invalidate the capture (its end
 * then returns mydevErrorStreamCaptureInvalidated and no graph):
 * synchronising or running inline on a capturing stream; synchronising or
 * querying an event recorded during capture (mydevErrorCapturedEvent); a
 * capturing stream waiting for an incomplete event recorded outside the
 * capture (mydevErrorStreamCaptureIsolation). In the global and thread-local
 * modes, mydevDeviceSynchronize, mydevDeviceWaitIdle and the synchronous
 * mydevMemcpy on the capture's device fail the same way (global: from any
 * host thread; thread-local: from the thread that began the capture).
 * Calls from launched functions are never refused. mydevStreamQuery works as
 * ever (a capturing stream only runs what was queued before the capture).
 * Capture is refused on a default stream.
 *
 * A graph runs as one launch (mydevGraphLaunch): one task on the stream that
 * runs every node, in the order they were captured (an order that respects
 * every dependency), on that stream's worker. A failing node is reported as
 * a failed launch under its own label, and the nodes after it still run. */
typedef enum mydevStreamCaptureMode {
  mydevStreamCaptureModeGlobal = 0,
  mydevStreamCaptureModeThreadLocal = 1,
  mydevStreamCaptureModeRelaxed = 2,
} mydevStreamCaptureMode;
typedef enum mydevStreamCaptureStatus {
  mydevStreamCaptureStatusNone = 0,
  mydevStreamCaptureStatusActive = 1,
  mydevStreamCaptureStatusInvalidated = 2,
} mydevStreamCaptureStatus;
typedef struct mydevGraph_st* mydevGraph_t;
typedef struct mydevGraphExec_st* mydevGraphExec_t;
/* Destroys what a capture or graph was given to keep (see below). */
typedef void (*mydevUserObjectDestroy_t)(void* object);

MYDEV_API mydevError_t mydevStreamBeginCapture(mydevStream_t stream, mydevStreamCaptureMode mode);
/* Ends the capture that `stream` began: *graph receives the graph (or NULL
 * when it fails: invalidated, unjoined). Every stream of the capture stops
 * capturing either way. */
MYDEV_API mydevError_t mydevStreamEndCapture(mydevStream_t stream, mydevGraph_t* graph);
/* status: None, Active or Invalidated; id (may be NULL): a number unique to
 * the capture in this process, 0 when not capturing. Never waits. */
MYDEV_API mydevError_t mydevStreamGetCaptureInfo(mydevStream_t stream, mydevStreamCaptureStatus* status,
                                                 unsigned long long* id);
/* Hands `object` to the capture `stream` takes part in: destroy(object) is
 * called, on the thread that drops the last of them, once the capture failed
 * or the graph and every executable made from it are destroyed. For the
 * user_data of captured launches, which replays run again and again. */
MYDEV_API mydevError_t mydevStreamCaptureRetainObject(mydevStream_t stream, void* object,
                                                      mydevUserObjectDestroy_t destroy);
MYDEV_API mydevError_t mydevGraphGetNodeCount(mydevGraph_t graph, size_t* count);
/* Writes the graph in Graphviz dot: one node per captured launch, copy or
 * memset (its label), one edge per dependency. */
MYDEV_API mydevError_t mydevGraphDebugDotPrint(mydevGraph_t graph, const char* path);
MYDEV_API mydevError_t mydevGraphDestroy(mydevGraph_t graph);
MYDEV_API mydevError_t mydevGraphInstantiate(mydevGraphExec_t* exec, mydevGraph_t graph);
/* Enqueues one replay of the graph on `stream` (any stream of the graph's
 * device, the default one included; not a capturing one). */
MYDEV_API mydevError_t mydevGraphLaunch(mydevGraphExec_t exec, mydevStream_t stream);
/* Waits for the executable's enqueued replays, then destroys it. */
MYDEV_API mydevError_t mydevGraphExecDestroy(mydevGraphExec_t exec);

#ifdef __cplusplus
}
#endif
#endif /* MYDEV_RUNTIME_H */
