#pragma once
// For the few thread-locals every op reads (the current stream, the running
// kernel). In a shared library such as this extension a thread-local is
// reached through a call to __tls_get_addr (the general dynamic model), and an
// op on a small tensor made about a dozen such calls. initial-exec makes each
// one load relative to the thread pointer, but the variable then lives in the
// static TLS block, and with it every thread-local of this library: the
// dynamic loader keeps about 1.6 KiB there for all the libraries loaded after
// start-up, and one that does not fit fails to load. So large per-thread
// tables go on the heap, behind a pointer (test_hot_thread_locals.py keeps
// the library's total under a budget). The runtime, which includes nothing of
// this layer, defines the same macro for its own (src/internal.h).
#if defined(__GNUC__) && defined(__linux__)
#define MYDEV_HOT_TLS __attribute__((tls_model("initial-exec")))
#else
#define MYDEV_HOT_TLS
#endif
