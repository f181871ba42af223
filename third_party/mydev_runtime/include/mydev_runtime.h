/*
 * mydev_runtime: the emulated accelerator's driver API.
 *
 * This header is the whole contract between the device and everything above it
 * (the PyTorch integration in csrc/). It has no PyTorch dependency, and a port
 * of my_device to real hardware replaces this library and nothing else.
 *
 * Conventions, modelled on the CUDA runtime so integration code reads familiarly:
 *  - every call returns a mydevError_t; mydevSuccess is 0;
 *  - the current device is per thread and starts at 0;
 *  - a NULL mydevStream_t means the default stream of the current device;
 *  - device pointers are only ever valid inside runtime copies and launched
 *    functions: with MYDEV_STRICT=1 device pages are PROT_NONE everywhere else.
 *
 * Environment (read once, at first use):
 *  MYDEV_DEVICE_COUNT  number of devices (default 2)
 *  MYDEV_MEMORY_LIMIT  capacity per device, bytes or with K/M/G/T suffix (default 8G)
 *  MYDEV_STRICT        1: host code touching device memory faults loudly
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
MYDEV_API mydevError_t mydevDeviceSynchronize(void);       /* current device: all its streams */
/* Nonzero once the runtime has been used in this process (first call other than
 * GetDeviceCount/GetErrorName/GetErrorString). Lets the integration decide lazily. */
MYDEV_API int mydevIsInitialized(void);

/* ---- device memory ---------------------------------------------------- */
MYDEV_API mydevError_t mydevMalloc(void** ptr, size_t size);  /* current device; size 0 gives NULL */
MYDEV_API mydevError_t mydevFree(void* ptr);                  /* NULL is a no-op */
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
typedef struct mydevStream_st* mydevStream_t;

MYDEV_API mydevError_t mydevDeviceGetStreamPriorityRange(int* least, int* greatest);
/* Creates a stream on the current device. Lower numbers are higher priority, as in CUDA. */
MYDEV_API mydevError_t mydevStreamCreateWithPriority(mydevStream_t* stream, int priority);
MYDEV_API mydevError_t mydevStreamDestroy(mydevStream_t stream);
MYDEV_API mydevError_t mydevStreamGetDevice(mydevStream_t stream, int* device);
MYDEV_API mydevError_t mydevStreamGetPriority(mydevStream_t stream, int* priority);
MYDEV_API mydevError_t mydevStreamSynchronize(mydevStream_t stream);
MYDEV_API mydevError_t mydevStreamQuery(mydevStream_t stream); /* mydevSuccess or mydevErrorNotReady */

/* A launched function is the emulated device's kernel: it runs in stream order,
 * with device memory accessible. It returns 0 on success; anything else makes
 * the launch (and the stream's next synchronisation) report
 * mydevErrorLaunchFailure. The runtime may run it before LaunchHostFunc
 * returns (as now) or later on a stream worker; callers must not assume either. */
typedef int (*mydevHostFn_t)(void* user_data);
MYDEV_API mydevError_t mydevLaunchHostFunc(mydevStream_t stream, mydevHostFn_t fn, void* user_data);

/* ---- copies ----------------------------------------------------------- */
typedef enum mydevMemcpyKind {
  mydevMemcpyHostToDevice = 1,
  mydevMemcpyDeviceToHost = 2,
  mydevMemcpyDeviceToDevice = 3, /* also across devices */
} mydevMemcpyKind;

/* Each device-side range must lie inside one live device allocation, and each
 * host-side range must not touch device memory; otherwise the copy fails with
 * mydevErrorInvalidDevicePointer / mydevErrorInvalidHostPointer and copies nothing. */
MYDEV_API mydevError_t mydevMemcpy(void* dst, const void* src, size_t count, mydevMemcpyKind kind);
MYDEV_API mydevError_t mydevMemcpyAsync(void* dst, const void* src, size_t count,
                                        mydevMemcpyKind kind, mydevStream_t stream);
MYDEV_API mydevError_t mydevMemsetAsync(void* dst, int value, size_t count, mydevStream_t stream);

/* ---- events ----------------------------------------------------------- */
typedef struct mydevEvent_st* mydevEvent_t;
enum { mydevEventDefault = 0x0, mydevEventDisableTiming = 0x2 };

MYDEV_API mydevError_t mydevEventCreateWithFlags(mydevEvent_t* event, unsigned int flags);
MYDEV_API mydevError_t mydevEventDestroy(mydevEvent_t event);
MYDEV_API mydevError_t mydevEventRecord(mydevEvent_t event, mydevStream_t stream);
MYDEV_API mydevError_t mydevEventQuery(mydevEvent_t event);       /* mydevSuccess or mydevErrorNotReady */
MYDEV_API mydevError_t mydevEventSynchronize(mydevEvent_t event);
/* Milliseconds between two recorded events; mydevErrorTimingDisabled if either lacks timing,
 * mydevErrorNotReady if either is not yet complete, mydevErrorInvalidResourceHandle if never recorded. */
MYDEV_API mydevError_t mydevEventElapsedTime(float* ms, mydevEvent_t start, mydevEvent_t end);
MYDEV_API mydevError_t mydevStreamWaitEvent(mydevStream_t stream, mydevEvent_t event);

/* ---- strict mode ------------------------------------------------------ */
MYDEV_API int mydevStrictMode(void); /* nonzero when MYDEV_STRICT=1 */

#ifdef __cplusplus
}
#endif
#endif /* MYDEV_RUNTIME_H */
