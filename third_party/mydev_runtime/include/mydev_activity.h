/* mydev runtime: activity tracing, the profiling interface of the runtime
 * (what CUPTI's activity API is to the CUDA runtime, and kept apart from
 * mydev_runtime.h for the same reason: only profilers need it). */
#ifndef MYDEV_ACTIVITY_H
#define MYDEV_ACTIVITY_H

#include "mydev_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* While a callback is set, every kernel launch, copy and memset that runs on a
 * stream is reported once it has run, with when it ran on the device, and
 * functions run in stream order by the caller (mydevLaunchHostFuncInline, and
 * every launch under MYDEV_LAUNCH_BLOCKING) likewise. The callback runs on the
 * thread that ran the work (a stream's worker, or the caller), so it must be
 * quick and thread safe, and must not call into the runtime. Each record
 * carries the external correlation id that was on top of the launching
 * thread's stack (mydevActivityPushExternalCorrelationId) when the work was
 * enqueued, so a profiler can attach it to the host operation that launched
 * it. Times are nanoseconds of the system (Unix epoch) clock. Work enqueued
 * while no callback was set is not reported. */
typedef enum {
  mydevActivityKindKernel = 0,
  mydevActivityKindMemcpy = 1,
  mydevActivityKindMemset = 2
} mydevActivityKind;
typedef struct {
  mydevActivityKind kind;
  int device;
  mydevStream_t stream;          /* NULL: the device's default stream */
  const char* label;             /* the launch's label; "" if none. Valid during the callback only */
  uint64_t correlation_id;       /* 0 if none was pushed */
  int64_t start_ns, end_ns;
  size_t bytes;                  /* copies and memsets */
  int inline_launch;             /* 1: run by the calling thread, in stream order */
} mydevActivityRecord;
typedef void (*mydevActivityCallback_t)(const mydevActivityRecord* record, void* user_data);
/* Sets (NULL: clears) the callback. Never initialises the runtime. */
MYDEV_API mydevError_t mydevActivitySetCallback(mydevActivityCallback_t callback, void* user_data);
/* Per calling thread. Pop returns mydevErrorInvalidValue on an empty stack. */
MYDEV_API mydevError_t mydevActivityPushExternalCorrelationId(uint64_t id);
MYDEV_API mydevError_t mydevActivityPopExternalCorrelationId(uint64_t* id);

#ifdef __cplusplus
}
#endif
#endif /* MYDEV_ACTIVITY_H */
