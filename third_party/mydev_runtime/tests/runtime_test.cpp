// Standalone tests for the mydev runtime. No framework: CHECK stops at the
// first failure with file:line and the expression.
//
//   runtime_test                     all in-process tests (any environment)
//   runtime_test env N LIMIT STRICT  configuration read from the environment
//   runtime_test strict              strict-mode behaviour (needs MYDEV_STRICT=1)
//   runtime_test strict-fault        touches device memory from host code: must abort
//   runtime_test strict-fault-running same|other
//                                    touches device memory while a kernel runs: must abort
//   runtime_test strict-fault-kernel a kernel dereferences a device address: must abort
//   runtime_test strict-fault-freed device|kernel
//                                    uses a freed allocation's device or kernel address: must abort
//   runtime_test strict-other-segv   an unrelated segfault in strict mode: must stay SIGSEGV
//   runtime_test fork                fork before and after initialisation
//   runtime_test blocking            MYDEV_LAUNCH_BLOCKING=1 behaviour (needs it set)
//   runtime_test exit-pending        exits with queued work: must exit promptly, dropping it
//   runtime_test exit-stuck          exits while a launched function is stuck: must not hang
//   runtime_test queue-depth         launch queue limit (needs a small MYDEV_LAUNCH_QUEUE_DEPTH)
//   runtime_test exit-full           exits while a thread waits for room in a full stream
#include "mydev_runtime.h"
#include "mydev_emulator.h"
#include "mydev_activity.h"
#include "check.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {


// In a forked child: report by exit status (the parent CHECKs it is 0).
#define CHILD_CHECK(cond, code) \
  do {                          \
    if (!(cond)) _exit(code);   \
  } while (0)

int deviceCount() {
  int n = 0;
  CHECK_OK(mydevGetDeviceCount(&n));
  return n;
}

size_t pageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// MYDEV_LAUNCH_BLOCKING=1: every enqueue returns once its work ran. The suite
// runs in both modes and checks what each promises.
bool launchBlocking() {
  const char* v = std::getenv("MYDEV_LAUNCH_BLOCKING");
  return v && std::strcmp(v, "1") == 0;
}

// What a failing launch itself returns.
mydevError_t launchFailureAtLaunch() { return launchBlocking() ? mydevErrorLaunchFailure : mydevSuccess; }

mydevStream_t newStream(int device = -1, int priority = 0) {
  int saved = 0;
  CHECK_OK(mydevGetDevice(&saved));
  if (device >= 0) CHECK_OK(mydevSetDevice(device));
  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, priority));
  CHECK_OK(mydevSetDevice(saved));
  return s;
}

std::string errorLabel(mydevStream_t s) {
  char buf[128];
  std::memset(buf, 'x', sizeof(buf));
  CHECK_OK(mydevStreamGetErrorLabel(s, buf, sizeof(buf)));
  return buf;
}

int setFlagKernel(void* ud) {
  static_cast<std::atomic<int>*>(ud)->fetch_add(1);
  return 0;
}

int noopKernel(void*) { return 0; }

double msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

size_t freeBytes(int device) {
  int saved;
  CHECK_OK(mydevGetDevice(&saved));
  CHECK_OK(mydevSetDevice(device));
  size_t free_b = 0, total_b = 0;
  CHECK_OK(mydevMemGetInfo(&free_b, &total_b));
  CHECK_OK(mydevSetDevice(saved));
  return free_b;
}

size_t limitBytes() {
  size_t free_b = 0, total_b = 0;
  CHECK_OK(mydevMemGetInfo(&free_b, &total_b));
  return total_b;
}

// Whether the kernel can read the byte at p on our behalf: write(2) into a pipe
// fails with EFAULT for a PROT_NONE page instead of raising SIGSEGV, which
// lets tests observe strict-mode protection without crashing.
bool hostReadable(const void* p) {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  ssize_t w = write(fds[1], p, 1);
  int err = errno;
  close(fds[0]);
  close(fds[1]);
  if (w == 1) return true;
  if (w < 0 && err == EFAULT) return false;
  std::abort();
}

void fillPattern(std::vector<unsigned char>& v, unsigned seed) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>((i * 31u + seed) & 0xff);
}

void waitChildOk(pid_t pid) {
  CHECK(pid > 0);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "child failed: %s %d\n", WIFEXITED(status) ? "exit" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

// ---- before initialisation ----------------------------------------------

// Must run before anything initialises the runtime in this process.
void testQueriesDoNotInitialise() {
  CHECK(!mydevIsInitialized());
  int n = 0;
  CHECK_OK(mydevGetDeviceCount(&n));
  CHECK(n >= 1);
  CHECK_ERR(mydevGetDeviceCount(nullptr), mydevErrorInvalidValue);
  (void)mydevGetErrorName(mydevErrorMemoryAllocation);
  (void)mydevGetErrorString(mydevErrorMemoryAllocation);
  CHECK(!mydevIsInitialized());
}

// A child of a parent that never initialised is a fresh process as far as the
// runtime is concerned. Must run before anything initialises.
void testForkBeforeInitIsUsable() {
  CHECK(!mydevIsInitialized());
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    void* d = nullptr;
    CHILD_CHECK(mydevMalloc(&d, 64) == mydevSuccess, 10);
    CHILD_CHECK(d != nullptr, 11);
    unsigned char in[64], out[64] = {};
    for (int i = 0; i < 64; ++i) in[i] = static_cast<unsigned char>(i + 1);
    CHILD_CHECK(mydevMemcpy(d, in, 64, mydevMemcpyHostToDevice) == mydevSuccess, 12);
    CHILD_CHECK(mydevMemcpy(out, d, 64, mydevMemcpyDeviceToHost) == mydevSuccess, 13);
    CHILD_CHECK(std::memcmp(in, out, 64) == 0, 14);
    std::atomic<int> flag{0};
    CHILD_CHECK(mydevLaunchHostFunc(nullptr, setFlagKernel, &flag) == mydevSuccess, 17);
    CHILD_CHECK(mydevStreamSynchronize(nullptr) == mydevSuccess, 18);
    CHILD_CHECK(flag.load() == 1, 19);
    CHILD_CHECK(mydevFree(d) == mydevSuccess, 15);
    CHILD_CHECK(mydevIsInitialized(), 16);
    // Leave work queued (blocking mode would wait for it here) and exit
    // normally: the child's own workers are stopped at exit without hanging.
    if (!launchBlocking()) {
      CHILD_CHECK(mydevTestSetStreamDelay(nullptr, 60 * 1000 * 1000) == mydevSuccess, 20);
      CHILD_CHECK(mydevLaunchHostFunc(nullptr, setFlagKernel, &flag) == mydevSuccess, 21);
    }
    std::exit(0);
  }
  waitChildOk(pid);
  CHECK(!mydevIsInitialized());  // the child's use is not the parent's
}

// ---- errors and devices -------------------------------------------------

void testErrorText() {
  CHECK(std::strcmp(mydevGetErrorName(mydevSuccess), "mydevSuccess") == 0);
  CHECK(std::strcmp(mydevGetErrorName(mydevErrorMemoryAllocation), "mydevErrorMemoryAllocation") == 0);
  CHECK(std::strcmp(mydevGetErrorName(mydevErrorInvalidHostPointer), "mydevErrorInvalidHostPointer") == 0);
  CHECK(std::strcmp(mydevGetErrorString(mydevErrorMemoryAllocation), "out of memory") == 0);
  CHECK(std::strcmp(mydevGetErrorString(mydevErrorInvalidDevice), "invalid device ordinal") == 0);
  for (int e = 0; e <= 10; ++e) {
    const char* name = mydevGetErrorName(static_cast<mydevError_t>(e));
    const char* text = mydevGetErrorString(static_cast<mydevError_t>(e));
    CHECK(std::strncmp(name, "mydev", 5) == 0);
    CHECK(std::strcmp(text, "unrecognized error code") != 0);
    CHECK(std::strlen(text) > 0);
  }
  CHECK(std::strcmp(mydevGetErrorName(static_cast<mydevError_t>(999)), "unrecognized error code") == 0);
  CHECK(std::strcmp(mydevGetErrorString(static_cast<mydevError_t>(-1)), "unrecognized error code") == 0);
}

void testDevices() {
  int n = deviceCount();
  int d = -1;
  CHECK_OK(mydevGetDevice(&d));
  CHECK(mydevIsInitialized());
  CHECK(d == 0);
  CHECK_ERR(mydevGetDevice(nullptr), mydevErrorInvalidValue);
  CHECK_ERR(mydevSetDevice(n), mydevErrorInvalidDevice);
  CHECK_ERR(mydevSetDevice(-1), mydevErrorInvalidDevice);
  CHECK_OK(mydevGetDevice(&d));
  CHECK(d == 0);  // a failed SetDevice changes nothing
  CHECK_OK(mydevSetDevice(n - 1));
  CHECK_OK(mydevGetDevice(&d));
  CHECK(d == n - 1);
  CHECK_OK(mydevSetDevice(0));

  mydevDeviceProp prop;
  CHECK_OK(mydevGetDeviceProperties(&prop, n - 1));
  CHECK(std::strcmp(prop.name, "mydev emulated accelerator") == 0);
  CHECK(prop.totalGlobalMem == limitBytes());
  CHECK(prop.multiProcessorCount >= 1);
  unsigned hw = std::thread::hardware_concurrency();
  if (hw) CHECK(prop.multiProcessorCount == static_cast<int>(hw));
  CHECK(prop.major == 1 && prop.minor == 0);
  CHECK_ERR(mydevGetDeviceProperties(&prop, n), mydevErrorInvalidDevice);
  CHECK_ERR(mydevGetDeviceProperties(nullptr, 0), mydevErrorInvalidValue);
  CHECK_OK(mydevDeviceSynchronize());
}

void testCurrentDeviceIsPerThread() {
  if (deviceCount() < 2) return;
  CHECK_OK(mydevSetDevice(1));
  int seen_by_thread = -1, thread_after_set = -1;
  std::thread t([&] {
    mydevGetDevice(&seen_by_thread);  // a new thread starts at device 0
    mydevSetDevice(0);
    mydevGetDevice(&thread_after_set);
  });
  t.join();
  CHECK(seen_by_thread == 0);
  CHECK(thread_after_set == 0);
  int d = -1;
  CHECK_OK(mydevGetDevice(&d));
  CHECK(d == 1);  // the thread's SetDevice(0) did not leak here

  CHECK_OK(mydevSetDevice(0));
  std::thread t2([&] { mydevSetDevice(1); });
  t2.join();
  CHECK_OK(mydevGetDevice(&d));
  CHECK(d == 0);
}

// ---- memory ---------------------------------------------------------------

void testMallocAccounting() {
  const size_t page = pageSize();
  const size_t limit = limitBytes();
  CHECK(freeBytes(0) == limit);  // nothing leaked by earlier tests

  void* p = reinterpret_cast<void*>(0x1);
  CHECK_OK(mydevMalloc(&p, 0));
  CHECK(p == nullptr);
  CHECK_OK(mydevFree(nullptr));
  CHECK_ERR(mydevMalloc(nullptr, 16), mydevErrorInvalidValue);
  CHECK_ERR(mydevMemGetInfo(nullptr, nullptr), mydevErrorInvalidValue);

  if (limit < 3 * page) return;
  void* a = nullptr;
  CHECK_OK(mydevMalloc(&a, 1));
  CHECK(a != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(a) % page == 0);
  CHECK(freeBytes(0) == limit - page);  // accounted page-rounded
  void* b = nullptr;
  CHECK_OK(mydevMalloc(&b, page + 1));
  CHECK(freeBytes(0) == limit - 3 * page);

  // Plain RW outside strict mode: the host can read what the runtime wrote.
  if (!mydevStrictMode()) CHECK(hostReadable(a));

  if (deviceCount() >= 2) {
    CHECK(freeBytes(1) == limit);  // devices are accounted separately
    CHECK_OK(mydevSetDevice(1));
    void* c = nullptr;
    CHECK_OK(mydevMalloc(&c, 10));
    CHECK_OK(mydevSetDevice(0));
    CHECK(freeBytes(1) == limit - page);
    CHECK(freeBytes(0) == limit - 3 * page);
    CHECK_OK(mydevFree(c));  // freeing from another current device is fine
    CHECK(freeBytes(1) == limit);
  }

  int on_stack = 0;
  CHECK_ERR(mydevFree(&on_stack), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevFree(static_cast<char*>(b) + 8), mydevErrorInvalidDevicePointer);  // interior
  CHECK(freeBytes(0) == limit - 3 * page);
  CHECK_OK(mydevFree(a));
  CHECK_ERR(mydevFree(a), mydevErrorInvalidDevicePointer);  // double free
  CHECK_OK(mydevFree(b));
  CHECK(freeBytes(0) == limit);
}

void testOutOfMemory() {
  const size_t page = pageSize();
  const size_t limit = limitBytes();
  if (limit < 2 * page) return;
  CHECK(freeBytes(0) == limit);
  const size_t usable = limit / page * page;
  const size_t half = usable / 2 / page * page;

  void* a = nullptr;
  void* b = nullptr;
  CHECK_OK(mydevMalloc(&a, half));
  CHECK_OK(mydevMalloc(&b, usable - half));
  CHECK(freeBytes(0) == limit - usable);
  unsigned char marker[16];
  std::memset(marker, 0x5a, sizeof(marker));
  CHECK_OK(mydevMemcpy(a, marker, sizeof(marker), mydevMemcpyHostToDevice));

  void* c = reinterpret_cast<void*>(0x1);
  CHECK_ERR(mydevMalloc(&c, 1), mydevErrorMemoryAllocation);
  CHECK(c == nullptr);
  CHECK_ERR(mydevMalloc(&c, limit + 1), mydevErrorMemoryAllocation);
  CHECK_ERR(mydevMalloc(&c, SIZE_MAX), mydevErrorMemoryAllocation);  // rounding would overflow
  CHECK(freeBytes(0) == limit - usable);  // failures account nothing

  // The existing allocations are untouched by the failures.
  unsigned char back[16] = {};
  CHECK_OK(mydevMemcpy(back, a, sizeof(back), mydevMemcpyDeviceToHost));
  CHECK(std::memcmp(back, marker, sizeof(back)) == 0);
  mydevPointerAttributes attr;
  CHECK_OK(mydevPointerGetAttributes(&attr, b));
  CHECK(attr.type == mydevMemoryTypeDevice && attr.size == usable - half);

  if (deviceCount() >= 2) {  // a full device 0 does not limit device 1
    CHECK_OK(mydevSetDevice(1));
    CHECK_OK(mydevMalloc(&c, page));
    CHECK_OK(mydevFree(c));
    CHECK_OK(mydevSetDevice(0));
  }

  CHECK_OK(mydevFree(b));
  CHECK_OK(mydevMalloc(&b, usable - half));  // room again after a free
  CHECK_OK(mydevFree(b));
  CHECK_OK(mydevFree(a));
  CHECK(freeBytes(0) == limit);
}

void testPinnedMemory() {
  void* h = nullptr;
  CHECK_OK(mydevHostAlloc(&h, 1000));
  CHECK(h != nullptr);
  std::memset(h, 7, 1000);  // pinned memory is ordinary host memory
  CHECK(freeBytes(0) == limitBytes());  // and does not use device capacity
  void* z = reinterpret_cast<void*>(0x1);
  CHECK_OK(mydevHostAlloc(&z, 0));
  CHECK(z == nullptr);
  CHECK_ERR(mydevHostAlloc(nullptr, 8), mydevErrorInvalidValue);

  int on_stack = 0;
  CHECK_ERR(mydevFreeHost(&on_stack), mydevErrorInvalidHostPointer);
  CHECK_ERR(mydevFreeHost(static_cast<char*>(h) + 1), mydevErrorInvalidHostPointer);
  CHECK_ERR(mydevFree(h), mydevErrorInvalidDevicePointer);  // pinned is not device memory
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 16));
  CHECK_ERR(mydevFreeHost(d), mydevErrorInvalidHostPointer);  // nor the other way round
  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevFreeHost(nullptr));
  CHECK_OK(mydevFreeHost(h));
  CHECK_ERR(mydevFreeHost(h), mydevErrorInvalidHostPointer);
}

void testPointerAttributes() {
  mydevPointerAttributes attr{};
  CHECK_ERR(mydevPointerGetAttributes(nullptr, &attr), mydevErrorInvalidValue);

  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 1000));
  CHECK_OK(mydevPointerGetAttributes(&attr, d));
  CHECK(attr.type == mydevMemoryTypeDevice);
  CHECK(attr.device == 0);
  CHECK(attr.base == d);
  CHECK(attr.size == 1000);

  CHECK_OK(mydevPointerGetAttributes(&attr, static_cast<char*>(d) + 999));  // interior
  CHECK(attr.type == mydevMemoryTypeDevice && attr.base == d && attr.size == 1000);

  CHECK_OK(mydevPointerGetAttributes(&attr, static_cast<char*>(d) + 1000));  // one past the end
  CHECK(attr.type == mydevMemoryTypeUnregistered);

  if (deviceCount() >= 2) {
    CHECK_OK(mydevSetDevice(1));
    void* d1 = nullptr;
    CHECK_OK(mydevMalloc(&d1, 64));
    CHECK_OK(mydevSetDevice(0));
    CHECK_OK(mydevPointerGetAttributes(&attr, static_cast<char*>(d1) + 10));
    CHECK(attr.type == mydevMemoryTypeDevice && attr.device == 1 && attr.base == d1 && attr.size == 64);
    CHECK_OK(mydevFree(d1));
  }

  void* h = nullptr;
  CHECK_OK(mydevHostAlloc(&h, 300));
  CHECK_OK(mydevPointerGetAttributes(&attr, static_cast<char*>(h) + 5));
  CHECK(attr.type == mydevMemoryTypeHost);
  CHECK(attr.device == -1);
  CHECK(attr.base == h);
  CHECK(attr.size == 300);

  int on_stack = 0;
  std::vector<char> on_heap(10);
  for (const void* p : {static_cast<const void*>(&on_stack), static_cast<const void*>(on_heap.data()),
                        static_cast<const void*>(nullptr)}) {
    attr.type = mydevMemoryTypeDevice;
    CHECK_OK(mydevPointerGetAttributes(&attr, p));
    CHECK(attr.type == mydevMemoryTypeUnregistered);
    CHECK(attr.device == -1);
    CHECK(attr.base == nullptr);
    CHECK(attr.size == 0);
  }

  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevPointerGetAttributes(&attr, d));
  CHECK(attr.type == mydevMemoryTypeUnregistered);  // freed memory is forgotten
  CHECK_OK(mydevFreeHost(h));
  CHECK_OK(mydevPointerGetAttributes(&attr, h));
  CHECK(attr.type == mydevMemoryTypeUnregistered);
}

// ---- copies ---------------------------------------------------------------

void testCopiesRoundTrip() {
  const size_t n = 10000;
  std::vector<unsigned char> src(n), back(n);
  fillPattern(src, 3);

  void* a = nullptr;
  void* b = nullptr;
  CHECK_OK(mydevMalloc(&a, n));
  CHECK_OK(mydevMalloc(&b, n));
  CHECK_OK(mydevMemcpy(a, src.data(), n, mydevMemcpyHostToDevice));
  CHECK_OK(mydevMemcpy(b, a, n, mydevMemcpyDeviceToDevice));
  CHECK_OK(mydevMemcpy(back.data(), b, n, mydevMemcpyDeviceToHost));
  CHECK(back == src);

  // Interior ranges, and an overlapping copy within one allocation.
  CHECK_OK(mydevMemcpy(static_cast<char*>(a) + 1, a, n - 1, mydevMemcpyDeviceToDevice));
  CHECK_OK(mydevMemcpy(back.data(), a, n, mydevMemcpyDeviceToHost));
  CHECK(back[0] == src[0]);
  CHECK(std::memcmp(back.data() + 1, src.data(), n - 1) == 0);
  unsigned char tail[4] = {};
  CHECK_OK(mydevMemcpy(tail, static_cast<char*>(b) + n - 4, 4, mydevMemcpyDeviceToHost));
  CHECK(std::memcmp(tail, src.data() + n - 4, 4) == 0);

  // Async copies and memset on a created stream, and pinned host buffers.
  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, 0));
  void* pinned = nullptr;
  CHECK_OK(mydevHostAlloc(&pinned, n));
  CHECK_OK(mydevMemsetAsync(a, 0xab, n, s));
  CHECK_OK(mydevStreamSynchronize(s));  // streams are not ordered with each other
  CHECK_OK(mydevMemsetAsync(a, 0x11, 10, nullptr));
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK_OK(mydevMemcpyAsync(pinned, a, n, mydevMemcpyDeviceToHost, s));
  CHECK_OK(mydevStreamSynchronize(s));
  const unsigned char* pb = static_cast<const unsigned char*>(pinned);
  CHECK(pb[0] == 0x11 && pb[9] == 0x11 && pb[10] == 0xab && pb[n - 1] == 0xab);
  std::memcpy(pinned, src.data(), n);
  CHECK_OK(mydevMemcpyAsync(b, pinned, n, mydevMemcpyHostToDevice, s));
  CHECK_OK(mydevMemcpyAsync(back.data(), b, n, mydevMemcpyDeviceToHost, s));
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(back == src);

  // Across devices.
  if (deviceCount() >= 2) {
    CHECK_OK(mydevSetDevice(1));
    void* c = nullptr;
    CHECK_OK(mydevMalloc(&c, n));
    CHECK_OK(mydevSetDevice(0));
    CHECK_OK(mydevMemcpy(c, b, n, mydevMemcpyDeviceToDevice));
    std::fill(back.begin(), back.end(), 0);
    CHECK_OK(mydevMemcpy(back.data(), c, n, mydevMemcpyDeviceToHost));
    CHECK(back == src);
    CHECK_OK(mydevMemsetAsync(a, 0, n, s));
    CHECK_OK(mydevMemcpyAsync(a, c, n, mydevMemcpyDeviceToDevice, s));  // back from device 1
    CHECK_OK(mydevMemcpy(back.data(), a, n, mydevMemcpyDeviceToHost));  // waits for s
    CHECK(back == src);
    CHECK_OK(mydevFree(c));
  }

  // Zero bytes always succeed, whatever the pointers.
  CHECK_OK(mydevMemcpy(nullptr, nullptr, 0, mydevMemcpyHostToDevice));
  CHECK_OK(mydevMemcpyAsync(nullptr, reinterpret_cast<void*>(0x10), 0, mydevMemcpyDeviceToDevice, s));
  CHECK_OK(mydevMemsetAsync(nullptr, 0, 0, s));

  CHECK_OK(mydevStreamDestroy(s));
  CHECK_OK(mydevFreeHost(pinned));
  CHECK_OK(mydevFree(a));
  CHECK_OK(mydevFree(b));
}

// Device and kernel addresses: distinct in strict mode (same bytes), equal
// otherwise; translation works for interior and one-past-the-end pointers and
// leaves everything else alone.
void testKernelAddresses() {
  const bool strict = mydevStrictMode();
  const size_t n = 1000;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, n));
  auto* dc = static_cast<unsigned char*>(d);
  auto* k = static_cast<unsigned char*>(mydevKernelAddress(d));
  if (strict) {
    CHECK(k != dc);
    CHECK(reinterpret_cast<uintptr_t>(k) % pageSize() == 0);
    CHECK(!hostReadable(d));  // the device address stays sealed...
    CHECK(hostReadable(k));   // ...the kernel address is open
  } else {
    CHECK(k == dc);
  }
  for (size_t off : {size_t{0}, size_t{1}, size_t{499}, n - 1, n}) {
    CHECK(mydevKernelAddress(dc + off) == k + off);
    CHECK(mydevDeviceAddress(k + off) == dc + off);
    CHECK(mydevDeviceAddress(mydevKernelAddress(dc + off)) == dc + off);
    CHECK(mydevKernelAddress(k + off) == k + off);  // idempotent
    CHECK(mydevDeviceAddress(dc + off) == dc + off);
  }

  // Writes through the kernel address (here from the host thread, which may
  // hold one as well as a kernel may) are what copies of the device address see.
  std::vector<unsigned char> in(n), out(n);
  fillPattern(in, 11);
  std::memcpy(k, in.data(), n);
  CHECK_OK(mydevMemcpy(out.data(), d, n, mydevMemcpyDeviceToHost));
  CHECK(out == in);
  // And what copies write, the kernel address reads.
  fillPattern(in, 12);
  CHECK_OK(mydevMemcpy(d, in.data(), n, mydevMemcpyHostToDevice));
  CHECK(std::memcmp(k, in.data(), n) == 0);
  CHECK_OK(mydevMemsetAsync(dc + 10, 0x5a, 20, nullptr));
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK(k[9] == in[9] && k[10] == 0x5a && k[29] == 0x5a && k[30] == in[30]);

  // Not device memory: unchanged.
  void* h = nullptr;
  CHECK_OK(mydevHostAlloc(&h, 100));
  int local = 0;
  CHECK(mydevKernelAddress(nullptr) == nullptr);
  CHECK(mydevDeviceAddress(nullptr) == nullptr);
  CHECK(mydevKernelAddress(h) == h);
  CHECK(mydevDeviceAddress(h) == h);
  CHECK(mydevKernelAddress(&local) == &local);
  CHECK(mydevDeviceAddress(&local) == &local);
  CHECK(mydevKernelAddress(in.data()) == in.data());
  // The rounding tail beyond one past the end is not translated.
  CHECK(mydevKernelAddress(dc + n + 1) == dc + n + 1);
  CHECK(mydevDeviceAddress(k + n + 1) == k + n + 1);

  // Whole-page allocations (no rounding tail; mmap tends to place mappings
  // side by side): one past the end still translates as the end, and device
  // and kernel addresses are never confused.
  std::vector<void*> pages(6);
  for (auto& p : pages) CHECK_OK(mydevMalloc(&p, pageSize()));
  CHECK(freeBytes(0) == limitBytes() - 6 * pageSize() - pageSize());  // d, 1000 bytes: one page
  for (void* p : pages) {
    auto* pc = static_cast<unsigned char*>(p);
    auto* pk = static_cast<unsigned char*>(mydevKernelAddress(p));
    const size_t ps = pageSize();
    CHECK(strict ? pk != pc : pk == pc);
    CHECK(mydevDeviceAddress(p) == p);
    CHECK(mydevKernelAddress(pk) == pk);
    CHECK(mydevDeviceAddress(pk) == p);
    CHECK(mydevKernelAddress(pc + ps - 1) == pk + ps - 1);
    CHECK(mydevDeviceAddress(pk + ps - 1) == pc + ps - 1);
    CHECK(mydevKernelAddress(pc + ps) == pk + ps);
    CHECK(mydevDeviceAddress(pk + ps) == pc + ps);
    CHECK(mydevKernelAddress(pk + ps) == pk + ps);
    CHECK(mydevDeviceAddress(pc + ps) == pc + ps);
    if (strict) CHECK(!hostReadable(pc + ps));  // the extra page is sealed device memory too
    mydevPointerAttributes attr;
    CHECK_OK(mydevPointerGetAttributes(&attr, pc + ps));
    CHECK(attr.base != p);  // one past the end is not inside the allocation
  }
  // In strict mode no view starts where another ends (outside it, device
  // allocations may well be adjacent, and it does not matter).
  for (void* p : pages) {
    for (void* q : pages) {
      if (!strict || p == q) continue;
      auto* pk = static_cast<unsigned char*>(mydevKernelAddress(p));
      CHECK(mydevKernelAddress(q) != pk + pageSize());
      CHECK(q != static_cast<unsigned char*>(p) + pageSize());
    }
  }

  if (strict) {
    // Kernel addresses are host memory to the rest of the API.
    void* e = nullptr;
    CHECK_OK(mydevMalloc(&e, n));
    auto* ek = static_cast<unsigned char*>(mydevKernelAddress(e));
    mydevPointerAttributes attr;
    CHECK_OK(mydevPointerGetAttributes(&attr, k + 5));
    CHECK(attr.type == mydevMemoryTypeUnregistered && attr.base == nullptr && attr.device == -1);
    CHECK_ERR(mydevFree(k), mydevErrorInvalidDevicePointer);
    CHECK_ERR(mydevMemcpy(ek, in.data(), n, mydevMemcpyHostToDevice), mydevErrorInvalidDevicePointer);
    CHECK_ERR(mydevMemcpy(out.data(), k, n, mydevMemcpyDeviceToHost), mydevErrorInvalidDevicePointer);
    CHECK_ERR(mydevMemsetAsync(k, 0, n, nullptr), mydevErrorInvalidDevicePointer);
    // ... valid as the host side of a copy (a kernel copying into its own view):
    CHECK_OK(mydevMemcpy(ek, d, n, mydevMemcpyDeviceToHost));
    CHECK(std::memcmp(ek, k, n) == 0);
    CHECK_OK(mydevMemsetAsync(e, 0x33, n, nullptr));
    CHECK_OK(mydevMemcpyAsync(dc + 1, ek, 8, mydevMemcpyHostToDevice, nullptr));
    CHECK_OK(mydevStreamSynchronize(nullptr));
    CHECK(k[0] == in[0]);
    for (int i = 1; i <= 8; ++i) CHECK(k[i] == 0x33);
    // ... but a host range running into device memory is not.
    CHECK_ERR(mydevMemcpy(dc, dc - 1, 2, mydevMemcpyHostToDevice), mydevErrorInvalidHostPointer);
    CHECK_OK(mydevFree(e));
  } else {
    // Outside strict mode the kernel address is the device address, so it is
    // not host memory: portable code copies device memory as device memory.
    CHECK_ERR(mydevMemcpy(k, d, 8, mydevMemcpyDeviceToHost), mydevErrorInvalidHostPointer);
  }

  // Launched functions write through the kernel address.
  struct Fill {
    void* dev;
    size_t n;
  } fill{d, n};
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void* p) {
    auto* f = static_cast<Fill*>(p);
    auto* b = static_cast<unsigned char*>(mydevKernelAddress(f->dev));
    for (size_t i = 0; i < f->n; ++i) b[i] = static_cast<unsigned char>(i ^ 0x5c);
    return 0;
  }, &fill));
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK_OK(mydevMemcpy(out.data(), d, n, mydevMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) CHECK(out[i] == static_cast<unsigned char>(i ^ 0x5c));

  for (void* p : pages) CHECK_OK(mydevFree(p));
  CHECK_OK(mydevFreeHost(h));
  CHECK_OK(mydevFree(d));
  // Freed: nothing to translate any more.
  CHECK(mydevKernelAddress(dc + 1) == dc + 1);
  CHECK(mydevDeviceAddress(k + 1) == k + 1);
}

void testCopyValidation() {
  const size_t n = 100;
  std::vector<unsigned char> host(2 * n, 0xee), pattern(2 * n);
  fillPattern(pattern, 9);
  void* d = nullptr;
  void* e = nullptr;
  CHECK_OK(mydevMalloc(&d, n));
  CHECK_OK(mydevMalloc(&e, n));
  CHECK_OK(mydevMemcpy(d, pattern.data(), n, mydevMemcpyHostToDevice));

  auto deviceUnchanged = [&] {
    std::vector<unsigned char> got(n);
    CHECK_OK(mydevMemcpy(got.data(), d, n, mydevMemcpyDeviceToHost));
    return std::memcmp(got.data(), pattern.data(), n) == 0;
  };
  auto hostUnchanged = [&] {
    for (unsigned char c : host) {
      if (c != 0xee) return false;
    }
    return true;
  };

  // Device side not in any device allocation.
  std::vector<unsigned char> other(n, 1);
  CHECK_ERR(mydevMemcpy(other.data(), host.data(), n, mydevMemcpyHostToDevice), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevMemcpy(host.data(), other.data(), n, mydevMemcpyDeviceToHost), mydevErrorInvalidDevicePointer);
  CHECK(hostUnchanged());
  CHECK(other == std::vector<unsigned char>(n, 1));
  CHECK_ERR(mydevMemcpy(host.data(), nullptr, 1, mydevMemcpyDeviceToHost), mydevErrorInvalidDevicePointer);

  // Ranges running past the end of an allocation, including from the inside.
  CHECK_ERR(mydevMemcpy(d, host.data(), n + 1, mydevMemcpyHostToDevice), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevMemcpy(static_cast<char*>(d) + 50, host.data(), 51, mydevMemcpyHostToDevice),
            mydevErrorInvalidDevicePointer);
  CHECK(deviceUnchanged());
  CHECK_ERR(mydevMemcpy(host.data(), d, n + 1, mydevMemcpyDeviceToHost), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevMemcpy(host.data(), static_cast<char*>(d) + 99, 2, mydevMemcpyDeviceToHost),
            mydevErrorInvalidDevicePointer);
  CHECK(hostUnchanged());
  CHECK_ERR(mydevMemcpy(e, d, n + 1, mydevMemcpyDeviceToDevice), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevMemcpy(d, e, n + 1, mydevMemcpyDeviceToDevice), mydevErrorInvalidDevicePointer);
  CHECK(deviceUnchanged());
  CHECK_ERR(mydevMemsetAsync(d, 0, n + 1, nullptr), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevMemsetAsync(host.data(), 0, 1, nullptr), mydevErrorInvalidDevicePointer);
  CHECK(deviceUnchanged());
  CHECK(hostUnchanged());

  // The host side pointing into device memory: device-to-device in disguise.
  CHECK_ERR(mydevMemcpy(d, e, n, mydevMemcpyHostToDevice), mydevErrorInvalidHostPointer);
  CHECK(deviceUnchanged());
  CHECK_ERR(mydevMemcpy(e, d, n, mydevMemcpyDeviceToHost), mydevErrorInvalidHostPointer);
  // ... also into the page-rounding tail of an allocation.
  CHECK_ERR(mydevMemcpy(static_cast<char*>(e) + n + 8, d, 1, mydevMemcpyDeviceToHost),
            mydevErrorInvalidHostPointer);
  CHECK_ERR(mydevMemcpyAsync(d, static_cast<char*>(e) + 1, 1, mydevMemcpyHostToDevice, nullptr),
            mydevErrorInvalidHostPointer);
  CHECK(deviceUnchanged());
  CHECK_ERR(mydevMemcpy(nullptr, d, 1, mydevMemcpyDeviceToHost), mydevErrorInvalidValue);

  // Pinned memory is host memory, not device memory.
  void* pinned = nullptr;
  CHECK_OK(mydevHostAlloc(&pinned, n));
  CHECK_ERR(mydevMemcpy(pinned, d, n, mydevMemcpyDeviceToDevice), mydevErrorInvalidDevicePointer);
  CHECK_OK(mydevFreeHost(pinned));

  // Freed memory is no longer a valid device pointer.
  void* gone = nullptr;
  CHECK_OK(mydevMalloc(&gone, n));
  CHECK_OK(mydevFree(gone));
  CHECK_ERR(mydevMemcpy(host.data(), gone, 1, mydevMemcpyDeviceToHost), mydevErrorInvalidDevicePointer);

  // Bad kind and bad stream.
  CHECK_ERR(mydevMemcpy(d, host.data(), n, static_cast<mydevMemcpyKind>(0)), mydevErrorInvalidValue);
  CHECK_ERR(mydevMemcpy(d, host.data(), n, static_cast<mydevMemcpyKind>(7)), mydevErrorInvalidValue);
  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, 0));
  CHECK_OK(mydevStreamDestroy(s));
  CHECK_ERR(mydevMemcpyAsync(d, host.data(), n, mydevMemcpyHostToDevice, s), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevMemsetAsync(d, 0, n, s), mydevErrorInvalidResourceHandle);
  CHECK(deviceUnchanged());
  CHECK(hostUnchanged());

  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevFree(e));
}

// ---- streams and launches -------------------------------------------------

void testStreams() {
  int least = 99, greatest = 99;
  CHECK_OK(mydevDeviceGetStreamPriorityRange(&least, &greatest));
  CHECK(least == 0 && greatest == -1);

  mydevStream_t lo = nullptr, hi = nullptr, clamped_lo = nullptr, clamped_hi = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&lo, 0));
  CHECK_OK(mydevStreamCreateWithPriority(&hi, -1));
  CHECK_OK(mydevStreamCreateWithPriority(&clamped_lo, 5));
  CHECK_OK(mydevStreamCreateWithPriority(&clamped_hi, -7));
  CHECK(lo && hi && lo != hi);
  int p = 99;
  CHECK_OK(mydevStreamGetPriority(lo, &p));
  CHECK(p == 0);
  CHECK_OK(mydevStreamGetPriority(hi, &p));
  CHECK(p == -1);
  CHECK_OK(mydevStreamGetPriority(clamped_lo, &p));
  CHECK(p == 0);
  CHECK_OK(mydevStreamGetPriority(clamped_hi, &p));
  CHECK(p == -1);
  CHECK_OK(mydevStreamGetPriority(nullptr, &p));
  CHECK(p == 0);
  CHECK_ERR(mydevStreamCreateWithPriority(nullptr, 0), mydevErrorInvalidValue);

  int dev = -1;
  CHECK_OK(mydevStreamGetDevice(lo, &dev));
  CHECK(dev == 0);
  CHECK_OK(mydevStreamGetDevice(nullptr, &dev));
  CHECK(dev == 0);
  if (deviceCount() >= 2) {
    CHECK_OK(mydevSetDevice(1));
    mydevStream_t s1 = nullptr;
    CHECK_OK(mydevStreamCreateWithPriority(&s1, 0));
    CHECK_OK(mydevStreamGetDevice(nullptr, &dev));
    CHECK(dev == 1);  // the NULL stream follows the current device
    CHECK_OK(mydevSetDevice(0));
    CHECK_OK(mydevStreamGetDevice(s1, &dev));
    CHECK(dev == 1);  // a created stream keeps its device
    CHECK_OK(mydevStreamDestroy(s1));
  }

  CHECK_OK(mydevStreamQuery(lo));
  CHECK_OK(mydevStreamQuery(nullptr));
  CHECK_OK(mydevStreamSynchronize(lo));
  CHECK_OK(mydevStreamSynchronize(nullptr));

  CHECK_ERR(mydevStreamDestroy(nullptr), mydevErrorInvalidResourceHandle);
  CHECK_OK(mydevStreamDestroy(lo));
  CHECK_ERR(mydevStreamDestroy(lo), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevStreamQuery(lo), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevStreamSynchronize(lo), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevStreamGetDevice(lo, &dev), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevStreamGetPriority(lo, &p), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevLaunchHostFunc(lo, [](void*) { return 0; }, nullptr), mydevErrorInvalidResourceHandle);
  int bogus = 0;
  CHECK_ERR(mydevStreamQuery(reinterpret_cast<mydevStream_t>(&bogus)), mydevErrorInvalidResourceHandle);
  CHECK_OK(mydevStreamDestroy(hi));
  CHECK_OK(mydevStreamDestroy(clamped_lo));
  CHECK_OK(mydevStreamDestroy(clamped_hi));
}

// A default stream's explicit handle names that device's default stream
// whatever device is current: its work, query and synchronisation are the
// NULL stream's of that device; it cannot be destroyed.
void testDefaultStreamHandles() {
  mydevStream_t d0 = nullptr, again = nullptr;
  CHECK_ERR(mydevDeviceGetDefaultStream(0, nullptr), mydevErrorInvalidValue);
  CHECK_ERR(mydevDeviceGetDefaultStream(-1, &d0), mydevErrorInvalidDevice);
  CHECK_ERR(mydevDeviceGetDefaultStream(deviceCount(), &d0), mydevErrorInvalidDevice);
  CHECK_OK(mydevDeviceGetDefaultStream(0, &d0));
  CHECK_OK(mydevDeviceGetDefaultStream(0, &again));
  CHECK(d0 != nullptr && d0 == again);
  int dev = -1, p = 99;
  CHECK_OK(mydevStreamGetDevice(d0, &dev));
  CHECK_OK(mydevStreamGetPriority(d0, &p));
  CHECK(dev == 0 && p == 0);
  const int last = deviceCount() - 1;
  mydevStream_t dl = nullptr;
  CHECK_OK(mydevDeviceGetDefaultStream(last, &dl));
  CHECK_OK(mydevStreamGetDevice(dl, &dev));
  CHECK(dev == last && (last == 0) == (dl == d0));
  // Held back on the last device while device 0 is current: the handle's
  // query sees it busy, the NULL handle (device 0's) does not, and the
  // handle's synchronisation waits for it.
  CHECK_OK(mydevSetDevice(0));
  CHECK_OK(mydevTestSetStreamDelay(dl, 20000));
  std::atomic<int> ran{0};
  CHECK_OK(mydevLaunchHostFunc(dl, [](void* r) {
    int device = -1;
    mydevGetDevice(&device);
    static_cast<std::atomic<int>*>(r)->store(device + 1);
    return 0;
  }, &ran));
  if (!launchBlocking()) CHECK_ERR(mydevStreamQuery(dl), mydevErrorNotReady);  // (else it ran in the launch)
  if (last != 0) CHECK_OK(mydevStreamQuery(nullptr));
  CHECK_OK(mydevStreamSynchronize(dl));
  CHECK(ran.load() == last + 1);  // run with its stream's device current
  CHECK_OK(mydevTestSetStreamDelay(dl, 0));
  CHECK_ERR(mydevStreamDestroy(d0), mydevErrorInvalidResourceHandle);
  CHECK_OK(mydevStreamQuery(d0));  // still there
}

struct LaunchArgs {
  int* device_buf;  // device memory (device address), written by the "kernel"
  int value;
  int calls;
  int device_seen;
};

int writeKernel(void* ud) {
  auto* a = static_cast<LaunchArgs*>(ud);
  a->calls++;
  mydevGetDevice(&a->device_seen);
  int* buf = static_cast<int*>(mydevKernelAddress(a->device_buf));
  for (int i = 0; i < 256; ++i) buf[i] = a->value + i;
  return 0;
}

// Counts its calls; several streams' workers may share one counter.
int failingKernel(void* ud) {
  static_cast<std::atomic<int>*>(ud)->fetch_add(1);
  return 3;
}

void testLaunch() {
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 256 * sizeof(int)));
  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, 0));

  LaunchArgs args{static_cast<int*>(d), 1000, 0, -1};
  CHECK_OK(mydevLaunchHostFunc(s, writeKernel, &args));
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(args.calls == 1);
  CHECK(args.device_seen == 0);
  std::vector<int> back(256);
  CHECK_OK(mydevMemcpy(back.data(), d, 256 * sizeof(int), mydevMemcpyDeviceToHost));
  for (int i = 0; i < 256; ++i) CHECK(back[i] == 1000 + i);
  CHECK_OK(mydevLaunchHostFunc(nullptr, writeKernel, &args));
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK(args.calls == 2);
  CHECK_ERR(mydevLaunchHostFunc(s, nullptr, nullptr), mydevErrorInvalidValue);

  // A failure is reported once by the next synchronisation (and, in blocking
  // mode, by the launch itself).
  std::atomic<int> failures{0};
  mydevEvent_t done = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&done, mydevEventDisableTiming));
  CHECK_ERR(mydevLaunchHostFunc(s, failingKernel, &failures), launchFailureAtLaunch());
  CHECK_OK(mydevEventRecord(done, s));
  CHECK_OK(mydevEventSynchronize(done));  // waits without consuming it
  CHECK(failures == 1);
  CHECK_OK(mydevStreamQuery(s));  // querying does not consume it
  CHECK_OK(mydevStreamSynchronize(nullptr));  // another stream is not affected
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);
  CHECK_OK(mydevStreamSynchronize(s));  // cleared
  CHECK_OK(mydevDeviceSynchronize());
  CHECK_OK(mydevEventDestroy(done));

  // DeviceSynchronize reports them too, one each, and clears them for the streams.
  CHECK_ERR(mydevLaunchHostFunc(s, failingKernel, &failures), launchFailureAtLaunch());
  CHECK_ERR(mydevLaunchHostFunc(nullptr, failingKernel, &failures), launchFailureAtLaunch());
  CHECK_OK(mydevDeviceWaitIdle());  // waits, leaving both for the synchronisations
  CHECK(mydevStreamQuery(s) == mydevSuccess);
  CHECK_ERR(mydevDeviceSynchronize(), mydevErrorLaunchFailure);
  CHECK_ERR(mydevDeviceSynchronize(), mydevErrorLaunchFailure);
  CHECK_OK(mydevDeviceSynchronize());
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_OK(mydevStreamSynchronize(nullptr));

  // Work after a failure still runs; the synchronous copy waits for it.
  CHECK_ERR(mydevLaunchHostFunc(s, failingKernel, &failures), launchFailureAtLaunch());
  args.value = 7;
  CHECK_OK(mydevLaunchHostFunc(s, writeKernel, &args));
  CHECK_OK(mydevMemcpy(back.data(), d, sizeof(int), mydevMemcpyDeviceToHost));
  CHECK(back[0] == 7);
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);  // the copy left it pending
  CHECK(failures == 4);

  if (deviceCount() >= 2) {
    CHECK_OK(mydevSetDevice(1));
    mydevStream_t s1 = nullptr;
    CHECK_OK(mydevStreamCreateWithPriority(&s1, -1));
    CHECK_OK(mydevSetDevice(0));
    // A launched function runs "on" its stream's device.
    CHECK_OK(mydevLaunchHostFunc(s1, writeKernel, &args));
    CHECK_OK(mydevStreamSynchronize(s1));
    CHECK(args.device_seen == 1);
    int cur = -1;
    CHECK_OK(mydevGetDevice(&cur));
    CHECK(cur == 0);
    // A failure on device 1 is not device 0's to report.
    CHECK_ERR(mydevLaunchHostFunc(s1, failingKernel, &failures), launchFailureAtLaunch());
    CHECK_OK(mydevDeviceSynchronize());
    CHECK_OK(mydevSetDevice(1));
    CHECK_ERR(mydevDeviceSynchronize(), mydevErrorLaunchFailure);
    CHECK_OK(mydevStreamSynchronize(s1));
    CHECK_OK(mydevSetDevice(0));
    CHECK_OK(mydevStreamDestroy(s1));
  }

  CHECK_OK(mydevStreamDestroy(s));
  CHECK_OK(mydevFree(d));
}

// ---- events ---------------------------------------------------------------

void testEvents() {
  mydevEvent_t e1 = nullptr, e2 = nullptr, e3 = nullptr, nt = nullptr, never = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&e1, mydevEventDefault));
  CHECK_OK(mydevEventCreateWithFlags(&e2, mydevEventDefault));
  CHECK_OK(mydevEventCreateWithFlags(&e3, mydevEventDefault));
  CHECK_OK(mydevEventCreateWithFlags(&nt, mydevEventDisableTiming));
  CHECK_OK(mydevEventCreateWithFlags(&never, mydevEventDefault));
  mydevEvent_t bad = nullptr;
  CHECK_ERR(mydevEventCreateWithFlags(&bad, 0x1), mydevErrorInvalidValue);
  CHECK_ERR(mydevEventCreateWithFlags(nullptr, 0), mydevErrorInvalidValue);

  // Never recorded: complete for Query/Synchronize, no time to measure.
  CHECK_OK(mydevEventQuery(never));
  CHECK_OK(mydevEventSynchronize(never));
  float ms = -1;
  CHECK_ERR(mydevEventElapsedTime(&ms, never, never), mydevErrorInvalidResourceHandle);

  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, 0));
  CHECK_OK(mydevEventRecord(e1, s));
  CHECK_ERR(mydevEventElapsedTime(&ms, e1, never), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventElapsedTime(&ms, never, e1), mydevErrorInvalidResourceHandle);
  // Stamps are taken when the worker reaches the marker: synchronise before
  // sleeping so each sleep lies between two stamps.
  CHECK_OK(mydevEventSynchronize(e1));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK_OK(mydevEventRecord(e2, s));
  CHECK_OK(mydevEventSynchronize(e2));
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  CHECK_OK(mydevEventRecord(e3, nullptr));
  CHECK_OK(mydevEventSynchronize(e3));
  CHECK_OK(mydevEventQuery(e1));
  CHECK_OK(mydevEventSynchronize(e2));
  CHECK_OK(mydevStreamWaitEvent(s, e3));
  CHECK_OK(mydevStreamWaitEvent(nullptr, e1));
  CHECK_OK(mydevStreamWaitEvent(s, never));

  float t12 = -1, t13 = -1, t11 = -1, t21 = 1;
  CHECK_OK(mydevEventElapsedTime(&t12, e1, e2));
  CHECK_OK(mydevEventElapsedTime(&t13, e1, e3));
  CHECK_OK(mydevEventElapsedTime(&t11, e1, e1));
  CHECK_OK(mydevEventElapsedTime(&t21, e2, e1));
  CHECK(t12 >= 5.0f);  // at least the sleep between the records
  CHECK(t12 < 5000.0f);
  CHECK(t13 >= t12 + 2.0f);
  CHECK(t11 == 0.0f);
  CHECK(t21 == -t12);

  // Re-recording moves the event forward.
  CHECK_OK(mydevEventRecord(e1, s));
  CHECK_OK(mydevEventSynchronize(e1));
  CHECK_OK(mydevEventElapsedTime(&ms, e3, e1));
  CHECK(ms >= 0.0f);

  CHECK_OK(mydevEventRecord(nt, s));
  CHECK_OK(mydevEventSynchronize(nt));
  CHECK_OK(mydevEventQuery(nt));
  CHECK_ERR(mydevEventElapsedTime(&ms, nt, e1), mydevErrorTimingDisabled);
  CHECK_ERR(mydevEventElapsedTime(&ms, e1, nt), mydevErrorTimingDisabled);
  mydevEvent_t nt2 = nullptr;  // timing is checked before recording
  CHECK_OK(mydevEventCreateWithFlags(&nt2, mydevEventDisableTiming));
  CHECK_ERR(mydevEventElapsedTime(&ms, nt2, e1), mydevErrorTimingDisabled);
  CHECK_ERR(mydevEventElapsedTime(nullptr, e1, e2), mydevErrorInvalidValue);

  // Invalid handles.
  CHECK_OK(mydevEventDestroy(e3));
  CHECK_ERR(mydevEventDestroy(e3), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventDestroy(nullptr), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventQuery(e3), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventSynchronize(e3), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventRecord(e3, s), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventElapsedTime(&ms, e1, e3), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevStreamWaitEvent(s, e3), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevEventQuery(nullptr), mydevErrorInvalidResourceHandle);
  CHECK_OK(mydevStreamDestroy(s));
  CHECK_ERR(mydevEventRecord(e1, s), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevStreamWaitEvent(s, e1), mydevErrorInvalidResourceHandle);

  for (mydevEvent_t e : {e1, e2, nt, nt2, never}) CHECK_OK(mydevEventDestroy(e));
}

// ---- asynchronous execution ------------------------------------------------

// Delays are long enough that the host's next few calls certainly come first.
constexpr unsigned kDelayUs = 30000;

void testLaunchIsAsynchronous() {
  const bool blocking = launchBlocking();
  mydevStream_t s = newStream();
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
  std::atomic<int> flag{0};
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  if (blocking) {
    CHECK(flag.load() == 1);  // ran before the launch returned
    CHECK_OK(mydevStreamQuery(s));
  } else {
    CHECK(flag.load() == 0);  // enqueued, not run
    CHECK_ERR(mydevStreamQuery(s), mydevErrorNotReady);
  }
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(flag.load() == 1);
  CHECK_OK(mydevStreamQuery(s));

  // DeviceSynchronize waits for created streams too.
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  CHECK_OK(mydevDeviceSynchronize());
  CHECK(flag.load() == 2);

  // The default stream is asynchronous as well, and the delay is per stream.
  CHECK_OK(mydevTestSetStreamDelay(nullptr, kDelayUs));
  CHECK_OK(mydevLaunchHostFunc(nullptr, setFlagKernel, &flag));
  if (!blocking) {
    CHECK(flag.load() == 2);
    CHECK_ERR(mydevStreamQuery(nullptr), mydevErrorNotReady);
    CHECK_OK(mydevStreamQuery(s));
  }
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK(flag.load() == 3);
  CHECK_OK(mydevTestSetStreamDelay(nullptr, 0));

  // The synchronous copy waits for the device's pending work, on any stream.
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 256 * sizeof(int)));
  LaunchArgs args{static_cast<int*>(d), 40, 0, -1};
  CHECK_OK(mydevLaunchHostFunc(s, writeKernel, &args));
  std::vector<int> back(256);
  CHECK_OK(mydevMemcpy(back.data(), d, back.size() * sizeof(int), mydevMemcpyDeviceToHost));
  for (int i = 0; i < 256; ++i) CHECK(back[i] == 40 + i);
  CHECK(args.calls == 1);

  // Free does not wait for pending work.
  void* other = nullptr;
  CHECK_OK(mydevMalloc(&other, 64));
  CHECK_OK(mydevTestSetStreamDelay(s, 10 * kDelayUs));
  CHECK_OK(mydevLaunchHostFunc(s, noopKernel, nullptr));
  auto t0 = std::chrono::steady_clock::now();
  CHECK_OK(mydevFree(other));
  CHECK(msSince(t0) < 5.0 * kDelayUs / 1000);
  if (!blocking) CHECK_ERR(mydevStreamQuery(s), mydevErrorNotReady);
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));

  // Destroying a stream runs its queued work first.
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  CHECK_OK(mydevStreamDestroy(s));
  CHECK(flag.load() == 5);
  CHECK_OK(mydevFree(d));

  CHECK_ERR(mydevTestSetStreamDelay(s, 0), mydevErrorInvalidResourceHandle);
}

struct FifoItem {
  int* next;  // touched only by the stream's worker, read after synchronising
  int* errors;
  int index;
};

int fifoKernel(void* ud) {
  auto* it = static_cast<FifoItem*>(ud);
  if (*it->next != it->index) ++*it->errors;
  *it->next = it->index + 1;
  return 0;
}

void testFifoOrder() {
  const int n = 20000;
  int next = 0, errors = 0;
  std::vector<FifoItem> items(n);
  mydevStream_t s = newStream();
  for (int i = 0; i < n; ++i) {
    items[i] = FifoItem{&next, &errors, i};
    CHECK_OK(mydevLaunchHostFunc(s, fifoKernel, &items[i]));
  }
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(next == n);
  CHECK(errors == 0);
  CHECK_OK(mydevStreamDestroy(s));
}

struct ProducerConsumer {
  std::atomic<int> produced{0};
  std::atomic<int> observed{-1};
};

void testEventsOrderStreams() {
  const bool blocking = launchBlocking();
  const int n = deviceCount();
  // A on device 0 (slow), B on the last device, C idle on device 0.
  mydevStream_t a = newStream(0), b = newStream(n - 1), c = newStream(0);
  CHECK_OK(mydevTestSetStreamDelay(a, kDelayUs));
  mydevEvent_t ev = nullptr, never = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&ev, mydevEventDisableTiming));
  CHECK_OK(mydevEventCreateWithFlags(&never, 0));

  ProducerConsumer pc;
  auto produce = [](void* p) {
    static_cast<ProducerConsumer*>(p)->produced.store(1);
    return 0;
  };
  auto consume = [](void* p) {
    auto* x = static_cast<ProducerConsumer*>(p);
    x->observed.store(x->produced.load());
    return 0;
  };
  CHECK_OK(mydevLaunchHostFunc(a, produce, &pc));
  CHECK_OK(mydevEventRecord(ev, a));
  if (!blocking) CHECK_ERR(mydevEventQuery(ev), mydevErrorNotReady);
  CHECK_OK(mydevStreamWaitEvent(b, ev));
  // Re-recording the event on an idle stream completes it at once, but B's
  // wait is for the record that was current when it was made.
  CHECK_OK(mydevEventRecord(ev, c));
  CHECK_OK(mydevEventSynchronize(ev));
  CHECK_OK(mydevEventQuery(ev));
  CHECK_OK(mydevLaunchHostFunc(b, consume, &pc));
  CHECK_OK(mydevStreamSynchronize(b));
  CHECK(pc.observed.load() == 1);  // B's work started after A's
  CHECK_OK(mydevStreamSynchronize(a));

  // A wait on a complete or never-recorded event enqueues nothing.
  CHECK_OK(mydevStreamWaitEvent(b, ev));
  CHECK_OK(mydevStreamWaitEvent(b, never));
  CHECK_OK(mydevStreamQuery(b));
  // A later record does not affect work after an earlier wait.
  CHECK_OK(mydevEventRecord(ev, a));  // delayed
  CHECK_OK(mydevLaunchHostFunc(b, noopKernel, nullptr));
  CHECK_OK(mydevStreamSynchronize(b));
  if (!blocking) CHECK_ERR(mydevEventQuery(ev), mydevErrorNotReady);
  CHECK_OK(mydevEventSynchronize(ev));
  CHECK_OK(mydevEventQuery(ev));

  // A chain through three streams, each waiting for the previous one.
  pc.produced.store(0);
  pc.observed.store(-1);
  mydevEvent_t ev2 = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&ev2, 0));
  CHECK_OK(mydevLaunchHostFunc(a, produce, &pc));
  CHECK_OK(mydevEventRecord(ev, a));
  CHECK_OK(mydevStreamWaitEvent(c, ev));
  CHECK_OK(mydevEventRecord(ev2, c));
  CHECK_OK(mydevStreamWaitEvent(b, ev2));
  CHECK_OK(mydevLaunchHostFunc(b, consume, &pc));
  CHECK_OK(mydevStreamSynchronize(b));
  CHECK(pc.observed.load() == 1);
  // An event destroyed while a wait on it is pending does not break the wait.
  CHECK_OK(mydevLaunchHostFunc(a, noopKernel, nullptr));
  CHECK_OK(mydevEventRecord(ev2, a));
  CHECK_OK(mydevStreamWaitEvent(b, ev2));
  CHECK_OK(mydevEventDestroy(ev2));
  CHECK_OK(mydevLaunchHostFunc(b, noopKernel, nullptr));
  CHECK_OK(mydevStreamSynchronize(b));
  CHECK_OK(mydevStreamSynchronize(a));

  for (mydevStream_t s : {a, b, c}) CHECK_OK(mydevStreamDestroy(s));
  CHECK_OK(mydevEventDestroy(ev));
  CHECK_OK(mydevEventDestroy(never));
}

void testEventTimingAroundDelayedWork() {
  const bool blocking = launchBlocking();
  mydevStream_t s = newStream();
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
  mydevEvent_t start = nullptr, stop = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&start, 0));
  CHECK_OK(mydevEventCreateWithFlags(&stop, 0));
  CHECK_OK(mydevEventRecord(start, s));
  CHECK_OK(mydevLaunchHostFunc(s, noopKernel, nullptr));
  CHECK_OK(mydevEventRecord(stop, s));
  float ms = -1;
  if (!blocking) {
    CHECK_ERR(mydevEventQuery(stop), mydevErrorNotReady);
    CHECK_ERR(mydevEventElapsedTime(&ms, start, stop), mydevErrorNotReady);
  }
  CHECK_OK(mydevEventSynchronize(stop));
  CHECK_OK(mydevEventQuery(start));  // earlier in the same stream
  CHECK_OK(mydevEventElapsedTime(&ms, start, stop));
  CHECK(ms >= kDelayUs / 1000.0f);  // the task's delay lies between the stamps
  CHECK(ms < 10000.0f);
  // Re-recording makes the event incomplete again.
  CHECK_OK(mydevEventRecord(stop, s));
  if (!blocking) CHECK_ERR(mydevEventElapsedTime(&ms, start, stop), mydevErrorNotReady);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_OK(mydevEventElapsedTime(&ms, start, stop));
  CHECK(ms >= 2 * kDelayUs / 1000.0f);
  CHECK_OK(mydevStreamDestroy(s));
  CHECK_OK(mydevEventDestroy(start));
  CHECK_OK(mydevEventDestroy(stop));
}

int throwingKernel(void*) { throw std::runtime_error("kernel threw"); }

void testStickyErrorAndLabel() {
  const bool blocking = launchBlocking();
  mydevStream_t s = newStream();
  CHECK(errorLabel(s) == "");  // no failure yet
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
  std::atomic<int> failures{0};
  std::atomic<int> flag{0};
  char label[] = "aten::div.Tensor";
  CHECK_ERR(mydevLaunchHostFuncLabeled(s, failingKernel, &failures, label), launchFailureAtLaunch());
  std::memcpy(label, "overwritten!", 13);  // the runtime copied it
  CHECK_ERR(mydevLaunchHostFuncLabeled(s, failingKernel, &failures, "second failure"),
            launchFailureAtLaunch());
  CHECK_OK(mydevLaunchHostFuncLabeled(s, setFlagKernel, &flag, "aten::add.Tensor"));
  if (!blocking) CHECK(flag.load() == 0);
  CHECK_OK(mydevTestSetStreamDelay(s, 0));

  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);
  CHECK(failures == 2);
  CHECK(flag.load() == 1);  // work after the failures still ran
  CHECK(errorLabel(s) == "aten::div.Tensor");  // the first failure, the one reported
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);  // the second is not lost
  CHECK(errorLabel(s) == "second failure");
  CHECK_OK(mydevStreamSynchronize(s));  // each reported once
  CHECK(errorLabel(s) == "second failure");  // still the last reported one

  // Truncation and arguments.
  char small[5];
  CHECK_OK(mydevStreamGetErrorLabel(s, small, sizeof(small)));
  CHECK(std::strcmp(small, "seco") == 0);
  char one[1] = {'x'};
  CHECK_OK(mydevStreamGetErrorLabel(s, one, 1));
  CHECK(one[0] == '\0');
  CHECK_ERR(mydevStreamGetErrorLabel(s, nullptr, 10), mydevErrorInvalidValue);
  CHECK_ERR(mydevStreamGetErrorLabel(s, small, 0), mydevErrorInvalidValue);
  CHECK_ERR(mydevLaunchHostFuncLabeled(s, nullptr, nullptr, "x"), mydevErrorInvalidValue);

  // A successful labelled launch changes nothing; a new unlabelled failure
  // replaces the label with "".
  CHECK_OK(mydevLaunchHostFuncLabeled(s, noopKernel, nullptr, "fine"));
  CHECK_OK(mydevLaunchHostFuncLabeled(s, noopKernel, nullptr, nullptr));
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(errorLabel(s) == "second failure");
  CHECK_ERR(mydevLaunchHostFunc(s, failingKernel, &failures), launchFailureAtLaunch());
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);
  CHECK(errorLabel(s) == "");

  // Labels keep their first MYDEV_MAX_LABEL_LENGTH bytes.
  std::string long_label(300, 'L');
  for (size_t i = 0; i < long_label.size(); ++i) long_label[i] = static_cast<char>('a' + i % 26);
  CHECK_ERR(mydevLaunchHostFuncLabeled(s, failingKernel, &failures, long_label.c_str()),
            launchFailureAtLaunch());
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);
  char big[512];
  CHECK_OK(mydevStreamGetErrorLabel(s, big, sizeof(big)));
  CHECK(std::string(big) == long_label.substr(0, MYDEV_MAX_LABEL_LENGTH));
  CHECK(errorLabel(s) == long_label.substr(0, MYDEV_MAX_LABEL_LENGTH));

  // An exception escaping a launched function is a failure, not a crash.
  CHECK_ERR(mydevLaunchHostFuncLabeled(s, throwingKernel, nullptr, "throws"), launchFailureAtLaunch());
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);
  CHECK(errorLabel(s) == "throws");
  CHECK(flag.load() == 2);

  // DeviceSynchronize reports and clears it; the label stays with the stream.
  CHECK_ERR(mydevLaunchHostFuncLabeled(s, failingKernel, &failures, "via device sync"),
            launchFailureAtLaunch());
  CHECK_ERR(mydevDeviceSynchronize(), mydevErrorLaunchFailure);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(errorLabel(s) == "via device sync");
  CHECK(errorLabel(nullptr) == "");  // the default stream had no labelled failure here...
  CHECK_ERR(mydevLaunchHostFuncLabeled(nullptr, failingKernel, &failures, "on default"),
            launchFailureAtLaunch());
  CHECK_ERR(mydevStreamSynchronize(nullptr), mydevErrorLaunchFailure);
  CHECK(errorLabel(nullptr) == "on default");  // ... and NULL names it

  // A synchronous copy waits for the failed launch but leaves its sticky
  // error for the next synchronisation.
  CHECK_ERR(mydevLaunchHostFunc(s, failingKernel, &failures), launchFailureAtLaunch());
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 16));
  unsigned char buf[16] = {};
  CHECK_OK(mydevMemcpy(d, buf, sizeof(buf), mydevMemcpyHostToDevice));
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);
  CHECK_OK(mydevFree(d));

  CHECK_OK(mydevStreamDestroy(s));
  CHECK_ERR(mydevStreamGetErrorLabel(s, small, sizeof(small)), mydevErrorInvalidResourceHandle);
}

// mydevLaunchHostFuncInline: runs on the calling thread, in stream order.
struct InlineProbe {
  std::atomic<int>* flag;
  int flag_seen = -1;
  std::thread::id thread;
  int device = -1;
  int* dev_mem = nullptr;
  mydevStream_t stream = nullptr;
  mydevError_t query_inside = mydevSuccess;
  mydevError_t sync_inside = mydevErrorNotReady;
  mydevError_t launch_inside = mydevErrorNotReady;
  int flag_after_nested = -1;
};

int inlineProbeKernel(void* p) {
  auto* x = static_cast<InlineProbe*>(p);
  x->flag_seen = x->flag->load();
  x->thread = std::this_thread::get_id();
  mydevGetDevice(&x->device);
  // Device memory is reachable through its kernel address (strict mode too).
  static_cast<int*>(mydevKernelAddress(x->dev_mem))[0] = 77;
  x->query_inside = mydevStreamQuery(x->stream);  // this call itself is pending
  // Work enqueued from inside runs after this function, even when blocking.
  x->launch_inside = mydevLaunchHostFunc(x->stream, setFlagKernel, x->flag);
  x->sync_inside = mydevStreamSynchronize(x->stream);  // does not wait for itself
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  x->flag_after_nested = x->flag->load();
  return 0;
}

// Records the thread it ran on, and whether the flag it follows was set.
struct ShortProbe {
  std::atomic<int>* flag = nullptr;
  int flag_seen = -1;
  std::thread::id thread;
};

int shortProbeKernel(void* ud) {
  auto* p = static_cast<ShortProbe*>(ud);
  p->thread = std::this_thread::get_id();
  if (p->flag) p->flag_seen = p->flag->load();
  return 0;
}

void testShortTasks() {
  if (launchBlocking()) return;  // every launch runs in the caller there
  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, 0));
  CHECK_OK(mydevStreamSynchronize(s));
  // On an idle stream a short task runs at once, on the calling thread.
  ShortProbe idle;
  CHECK_OK(mydevLaunchHostFuncEx(s, shortProbeKernel, &idle, "short", mydevLaunchShortTask));
  CHECK(idle.thread == std::this_thread::get_id());
  CHECK_OK(mydevStreamQuery(s));
  // Behind queued work it is queued, and runs after that work, on the worker
  // (a delayed stream's, which a synchronising host does not drain).
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
  std::atomic<int> flag{0};
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  ShortProbe behind;
  behind.flag = &flag;
  CHECK_OK(mydevLaunchHostFuncEx(s, shortProbeKernel, &behind, "short", mydevLaunchShortTask));
  CHECK(behind.thread == std::thread::id());  // not run at the call
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_OK(mydevTestSetStreamDelay(s, 0));
  CHECK(behind.flag_seen == 1);
  CHECK(behind.thread != std::this_thread::get_id());
  // A stream with a test delay stands for a slow device: never run here.
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
  ShortProbe delayed;
  CHECK_OK(mydevLaunchHostFuncEx(s, shortProbeKernel, &delayed, "short", mydevLaunchShortTask));
  CHECK_ERR(mydevStreamQuery(s), mydevErrorNotReady);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(delayed.thread != std::this_thread::get_id());
  CHECK_OK(mydevTestSetStreamDelay(s, 0));
  // A failure run here is the stream's sticky error, with its label, for the next synchronisation.
  std::atomic<int> failures{0};
  CHECK_OK(mydevLaunchHostFuncEx(s, failingKernel, &failures, "short failure", mydevLaunchShortTask));
  CHECK(failures == 1);
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);
  char label[64];
  CHECK_OK(mydevStreamGetErrorLabel(s, label, sizeof(label)));
  CHECK(std::string(label) == "short failure");
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_ERR(mydevLaunchHostFuncEx(s, nullptr, nullptr, nullptr, mydevLaunchShortTask), mydevErrorInvalidValue);
  // Idle only: runs here on an idle stream, and behind queued work runs
  // nothing and enqueues nothing.
  const unsigned idle_only = mydevLaunchShortTask | mydevLaunchIdleOnly;
  ShortProbe now;
  CHECK_OK(mydevLaunchHostFuncEx(s, shortProbeKernel, &now, "idle only", idle_only));
  CHECK(now.thread == std::this_thread::get_id());
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
  std::atomic<int> later{0};
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &later));
  ShortProbe refused;
  CHECK_ERR(mydevLaunchHostFuncEx(s, shortProbeKernel, &refused, "idle only", idle_only), mydevErrorNotReady);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(later == 1);
  CHECK(refused.flag_seen == -1 && refused.thread == std::thread::id());
  CHECK_OK(mydevTestSetStreamDelay(s, 0));
  CHECK_OK(mydevStreamDestroy(s));
}

// A host thread waiting for a stream runs its queued work itself once the
// task the worker is running ends: in order, on the stream's device, "in" the
// stream, with failures reported as the worker's are.
struct DrainProbe {
  std::atomic<int>* order;
  int seen = -1;
  std::thread::id thread;
  int device = -1;
  mydevStream_t stream = nullptr;
  bool nested = true;  // synchronise the stream from inside (which would take a sticky error)
  mydevError_t nested_sync = mydevErrorNotReady;  // until it has run
  bool fail = false;
};

int drainProbeKernel(void* ud) {
  auto* p = static_cast<DrainProbe*>(ud);
  p->seen = p->order->fetch_add(1);
  p->thread = std::this_thread::get_id();
  mydevGetDevice(&p->device);
  // From inside the stream's own work a synchronisation does not wait for it.
  p->nested_sync = p->nested ? mydevStreamSynchronize(p->stream) : mydevSuccess;
  return p->fail ? 1 : 0;
}

struct HeldKernel {
  std::atomic<int> started{0};
  std::atomic<int> release{0};
  std::thread::id thread;
};

int heldKernel(void* ud) {
  auto* h = static_cast<HeldKernel*>(ud);
  h->thread = std::this_thread::get_id();
  h->started = 1;
  while (!h->release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return 0;
}

void testWaitingHostRunsQueuedWork() {
  if (launchBlocking()) return;  // nothing stays queued there
  const int n = deviceCount();
  const auto host = std::this_thread::get_id();
  // Launches `count` probes behind a kernel the worker is running, then lets
  // that kernel end shortly after `wait` has begun.
  auto run = [&](mydevStream_t s, DrainProbe* probes, int count, std::atomic<int>& order, auto wait) {
    HeldKernel held;
    CHECK_OK(mydevLaunchHostFunc(s, heldKernel, &held));
    for (int i = 0; i < count; ++i) {
      probes[i].order = &order;
      probes[i].stream = s;
      CHECK_OK(mydevLaunchHostFuncLabeled(s, drainProbeKernel, &probes[i], probes[i].fail ? "drained failure" : "probe"));
    }
    while (!held.started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      held.release = 1;
    });
    wait();
    releaser.join();
    CHECK(held.thread != host);  // the task running when the host began to wait stayed the worker's
  };
  mydevStream_t s = newStream(n - 1);
  // A synchronisation: every probe ran here, in order, on the stream's device,
  // and the caller's device is its own again.
  {
    std::atomic<int> order{0};
    DrainProbe probes[8];
    probes[5].fail = true;
    probes[6].nested = probes[7].nested = false;
    run(s, probes, 8, order, [&] { CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure); });
    for (int i = 0; i < 8; ++i) {
      CHECK(probes[i].seen == i);
      CHECK(probes[i].thread == host);
      CHECK(probes[i].device == n - 1);
      CHECK_OK(probes[i].nested_sync);
    }
    CHECK(errorLabel(s) == "drained failure");
    int cur = -1;
    CHECK_OK(mydevGetDevice(&cur));
    CHECK(cur == 0);
    CHECK_OK(mydevStreamQuery(s));
  }
  // An inline call behind queued work: the work before it runs here, then its function.
  {
    std::atomic<int> order{0};
    DrainProbe probes[4];
    DrainProbe last;
    last.order = &order;
    last.stream = s;
    run(s, probes, 4, order, [&] { CHECK_OK(mydevLaunchHostFuncInline(s, drainProbeKernel, &last)); });
    for (int i = 0; i < 4; ++i) CHECK(probes[i].thread == host && probes[i].seen == i);
    CHECK(last.seen == 4 && last.thread == host);
    CHECK_OK(mydevStreamSynchronize(s));
  }
  // An event synchronisation: the work before the record runs here; the
  // record is complete when it returns.
  {
    std::atomic<int> order{0};
    DrainProbe probes[4];
    DrainProbe after[2];
    mydevEvent_t ev = nullptr;
    CHECK_OK(mydevEventCreateWithFlags(&ev, 0));
    run(s, probes, 4, order, [&] {
      CHECK_OK(mydevEventRecord(ev, s));
      for (DrainProbe& p : after) {
        p.order = &order;
        p.stream = s;
        CHECK_OK(mydevLaunchHostFunc(s, drainProbeKernel, &p));
      }
      CHECK_OK(mydevEventSynchronize(ev));
      CHECK_OK(mydevEventQuery(ev));
    });
    for (int i = 0; i < 4; ++i) CHECK(probes[i].thread == host && probes[i].seen == i);
    CHECK_OK(mydevStreamSynchronize(s));
    CHECK(after[0].seen == 4 && after[1].seen == 5);
    CHECK_OK(mydevEventDestroy(ev));
  }
  // The worker goes on with work launched after the drain.
  {
    std::atomic<int> later{0};
    CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &later));
    CHECK_OK(mydevStreamSynchronize(s));
    CHECK(later == 1);
  }
  // Not drained: a delayed stream (the delay stands for device time) and a
  // stream of above-least priority: their work stays the worker's.
  auto stays_on_worker = [&](mydevStream_t t) {
    std::atomic<int> order{0};
    DrainProbe probes[4];
    run(t, probes, 4, order, [&] { CHECK_OK(mydevStreamSynchronize(t)); });
    for (int i = 0; i < 4; ++i) CHECK(probes[i].seen == i && probes[i].thread != host);
    mydevEvent_t ev = nullptr;
    CHECK_OK(mydevEventCreateWithFlags(&ev, 0));
    DrainProbe more[4];
    run(t, more, 4, order, [&] {
      CHECK_OK(mydevEventRecord(ev, t));
      CHECK_OK(mydevEventSynchronize(ev));
    });
    for (int i = 0; i < 4; ++i) CHECK(more[i].seen == 4 + i && more[i].thread != host);
    CHECK_OK(mydevEventDestroy(ev));
  };
  CHECK_OK(mydevTestSetStreamDelay(s, 1000));
  stays_on_worker(s);
  CHECK_OK(mydevTestSetStreamDelay(s, 0));
  int least = 0, greatest = 0;
  CHECK_OK(mydevDeviceGetStreamPriorityRange(&least, &greatest));
  mydevStream_t high = newStream(n - 1, greatest);
  stays_on_worker(high);
  CHECK_OK(mydevStreamDestroy(high));
  CHECK_OK(mydevStreamDestroy(s));
}

// Caller tasks: the caller runs the task itself between begin and end.
void testCallerTasks() {
  const int n = deviceCount();
  mydevStream_t s = newStream(n - 1);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_ERR(mydevStreamBeginCallerTask(s, nullptr), mydevErrorInvalidValue);
  CHECK_ERR(mydevStreamEndCallerTask(nullptr, 0, nullptr), mydevErrorInvalidValue);
  // On an idle stream: begun, and while it runs the stream is busy with it,
  // on its device; work launched meanwhile runs after it.
  mydevCallerTask task;
  CHECK_OK(mydevStreamBeginCallerTask(s, &task));
  int cur = -1;
  CHECK_OK(mydevGetDevice(&cur));
  CHECK(cur == n - 1);
  CHECK_ERR(mydevStreamQuery(s), mydevErrorNotReady);
  std::atomic<int> flag{0};
  if (!launchBlocking()) {  // (there a launch runs in the caller, inside the task)
    std::thread other([&] { CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag)); });
    other.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(flag == 0);  // held back by the task
  }
  CHECK_OK(mydevStreamSynchronize(s));  // inside the task: does not wait for it
  CHECK_OK(mydevStreamEndCallerTask(&task, 0, "caller task"));
  CHECK_OK(mydevGetDevice(&cur));
  CHECK(cur == 0);  // the caller's device is back
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(flag == (launchBlocking() ? 0 : 1));
  // A failed task is the stream's sticky error, with its label; under
  // MYDEV_LAUNCH_BLOCKING also the end's return value.
  CHECK_OK(mydevStreamBeginCallerTask(s, &task));
  CHECK_ERR(mydevStreamEndCallerTask(&task, 1, "failed caller task"),
            launchBlocking() ? mydevErrorLaunchFailure : mydevSuccess);
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);
  char label[64];
  CHECK_OK(mydevStreamGetErrorLabel(s, label, sizeof(label)));
  CHECK(std::string(label) == "failed caller task");
  CHECK_OK(mydevStreamSynchronize(s));  // reported once
  // Behind queued work, or from inside the stream's own work: nothing begun.
  if (!launchBlocking()) {
    CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
    std::atomic<int> queued{0};
    CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &queued));
    CHECK_ERR(mydevStreamBeginCallerTask(s, &task), mydevErrorNotReady);
    CHECK_OK(mydevStreamSynchronize(s));
    CHECK(queued == 1);
    CHECK_OK(mydevTestSetStreamDelay(s, 0));
  }
  struct Nested {
    mydevStream_t s;
    mydevError_t begun = mydevSuccess;
  } nested{s};
  CHECK_OK(mydevLaunchHostFuncInline(s, [](void* ud) -> int {
    auto* p = static_cast<Nested*>(ud);
    mydevCallerTask inner;
    p->begun = mydevStreamBeginCallerTask(p->s, &inner);
    return 0;
  }, &nested));
  CHECK(nested.begun == mydevErrorNotReady);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_OK(mydevStreamDestroy(s));
}

void testLaunchInline() {
  const int n = deviceCount();
  int* d = nullptr;
  CHECK_OK(mydevSetDevice(n - 1));
  CHECK_OK(mydevMalloc(reinterpret_cast<void**>(&d), 64));
  CHECK_OK(mydevSetDevice(0));
  mydevStream_t s = newStream(n - 1);
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
  std::atomic<int> flag{0};
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));  // pending, delayed
  InlineProbe probe;
  probe.flag = &flag;
  probe.dev_mem = d;
  probe.stream = s;
  CHECK_OK(mydevLaunchHostFuncInline(s, inlineProbeKernel, &probe));
  CHECK(probe.flag_seen == 1);  // after the work queued before it
  CHECK(probe.thread == std::this_thread::get_id());
  CHECK(probe.device == n - 1);  // on the stream's device...
  int cur = -1;
  CHECK_OK(mydevGetDevice(&cur));
  CHECK(cur == 0);  // ... and the caller's device is restored
  CHECK(probe.query_inside == mydevErrorNotReady);
  CHECK(probe.launch_inside == mydevSuccess);
  CHECK(probe.sync_inside == mydevSuccess);
  CHECK(probe.flag_after_nested == 1);  // the nested launch had not run yet
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(flag.load() == 2);
  int back = 0;
  CHECK_OK(mydevMemcpy(&back, d, sizeof(int), mydevMemcpyDeviceToHost));
  CHECK(back == 77);

  // An idle stream, and the default stream.
  CHECK_OK(mydevTestSetStreamDelay(s, 0));
  probe.stream = nullptr;
  CHECK_OK(mydevSetDevice(n - 1));
  CHECK_OK(mydevLaunchHostFuncInline(nullptr, inlineProbeKernel, &probe));
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK(flag.load() == 3);
  CHECK_OK(mydevSetDevice(0));

  // Failure is returned directly and is not sticky.
  std::atomic<int> failures{0};
  CHECK_ERR(mydevLaunchHostFuncInline(s, failingKernel, &failures), mydevErrorLaunchFailure);
  CHECK_ERR(mydevLaunchHostFuncInline(s, throwingKernel, nullptr), mydevErrorLaunchFailure);
  CHECK(failures.load() == 1);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_ERR(mydevLaunchHostFuncInline(s, nullptr, nullptr), mydevErrorInvalidValue);

  // Several threads mixing launches and inline calls on one fresh stream: the
  // inline function sees all of its thread's earlier launches done, and never
  // overlaps other work of the stream.
  struct Shared {
    std::atomic<bool> busy{false};
    std::atomic<int> errors{0};
    int done[4] = {0, 0, 0, 0};  // per thread, touched only in stream order
  } shared;
  struct Item {
    Shared* sh;
    int thread;
    int expect;
  };
  auto body = [](void* p) {
    auto* it = static_cast<Item*>(p);
    if (it->sh->busy.exchange(true)) it->sh->errors++;
    if (it->expect >= 0 && it->sh->done[it->thread] != it->expect) it->sh->errors++;
    if (it->expect < 0) it->sh->done[it->thread]++;
    it->sh->busy.store(false);
    return 0;
  };
  mydevStream_t fresh = newStream();
  std::vector<std::thread> pool;
  std::atomic<int> failed{0};
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&, t] {
      std::vector<Item> launched(300);
      for (int i = 0; i < 300; ++i) {
        launched[i] = Item{&shared, t, -1};
        if (mydevLaunchHostFunc(fresh, body, &launched[i]) != mydevSuccess) failed++;
        if (i % 3 == 0) {
          Item check{&shared, t, i + 1};
          if (mydevLaunchHostFuncInline(fresh, body, &check) != mydevSuccess) failed++;
        }
      }
      if (mydevStreamSynchronize(fresh) != mydevSuccess) failed++;  // launched outlives its work
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failed.load() == 0);
  CHECK(shared.errors.load() == 0);
  for (int t = 0; t < 4; ++t) CHECK(shared.done[t] == 300);

  CHECK_OK(mydevStreamDestroy(fresh));
  CHECK_OK(mydevStreamDestroy(s));
  CHECK_ERR(mydevLaunchHostFuncInline(s, noopKernel, nullptr), mydevErrorInvalidResourceHandle);
  CHECK_OK(mydevFree(d));
}

// ---- priorities ---------------------------------------------------------------
// Deterministic: streams are held by kernels that wait for a host latch, never
// by sleeps, and the order in which tasks ran is recorded.

struct Latch {
  std::atomic<bool> started{false};
  std::atomic<bool> released{false};
  void waitStarted() const {
    while (!started.load()) std::this_thread::yield();
  }
};

int latchKernel(void* ud) {
  auto* l = static_cast<Latch*>(ud);
  l->started.store(true);
  while (!l->released.load()) std::this_thread::yield();
  return 0;
}

// Launches kernels that append their id to `order` when they run.
struct OrderLog {
  struct Item {
    OrderLog* log;
    int id;
  };
  std::mutex mu;
  std::vector<int> order;
  std::deque<Item> items;  // a deque: launched items must not move

  static int kernel(void* ud) {
    auto* item = static_cast<Item*>(ud);
    item->log->push(item->id);
    return 0;
  }
  void launch(mydevStream_t s, int id) {
    items.push_back(Item{this, id});
    CHECK_OK(mydevLaunchHostFunc(s, kernel, &items.back()));
  }
  void push(int id) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(id);
  }
  size_t indexOf(int id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = std::find(order.begin(), order.end(), id);
    CHECK(it != order.end());
    return static_cast<size_t>(it - order.begin());
  }
  void clear() {  // only once everything launched has run
    order.clear();
    items.clear();
  }
};

// Synchronises the stream, failing the test (instead of hanging it) if that
// takes more than `seconds`: a deadlock shows as this failure.
void syncWithin(mydevStream_t s, int seconds, const char* what) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    mydevError_t rc = mydevSuccess;
  };
  auto st = std::make_shared<State>();
  std::thread([st, s] {
    mydevError_t rc = mydevStreamSynchronize(s);
    std::lock_guard<std::mutex> lock(st->mu);
    st->rc = rc;
    st->done = true;
    st->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(st->mu);
  if (!st->cv.wait_for(lock, std::chrono::seconds(seconds), [&] { return st->done; })) {
    std::fprintf(stderr, "%s: still waiting after %d s (deadlock)\n", what, seconds);
    std::fflush(stderr);
    _exit(1);
  }
  CHECK_OK(st->rc);
}

// A high-priority stream with runnable work holds back the workers of
// lower-priority streams on its device (the default stream included) until it
// has none; other devices are not held back.
void testPriorityOrder() {
  const bool blocking = launchBlocking();
  const int n = deviceCount();
  mydevStream_t low = newStream(0, 0);
  mydevStream_t high = newStream(0, -1);
  int prio = 1;
  CHECK_OK(mydevStreamGetPriority(high, &prio));
  CHECK(prio == -1);
  OrderLog log;
  auto launch = [&](mydevStream_t s, int id) { log.launch(s, id); };
  CHECK_OK(mydevSetDevice(0));
  if (blocking) {
    // Every launch has run when it returns: program order, priorities have no effect.
    for (int i = 0; i < 3; ++i) {
      launch(low, 10 + i);
      launch(high, 20 + i);
      launch(nullptr, 30 + i);
    }
    CHECK_OK(mydevDeviceSynchronize());
    CHECK((log.order == std::vector<int>{10, 20, 30, 11, 21, 31, 12, 22, 32}));
    CHECK_OK(mydevStreamDestroy(low));
    CHECK_OK(mydevStreamDestroy(high));
    return;
  }
  // The high stream runs a held kernel with four tasks queued behind it: it is
  // runnable, so nothing the low streams enqueue may start. The high stream
  // stops being runnable when its worker takes its last task, which then runs
  // beside the low streams' work: a trailing no-op keeps the logged tasks clear
  // of that.
  Latch latch;
  CHECK_OK(mydevLaunchHostFunc(high, latchKernel, &latch));
  latch.waitStarted();
  for (int i = 0; i < 4; ++i) launch(high, 20 + i);
  CHECK_OK(mydevLaunchHostFunc(high, noopKernel, nullptr));
  for (int i = 0; i < 4; ++i) launch(low, 10 + i);
  for (int i = 0; i < 2; ++i) launch(nullptr, 30 + i);
  // Another device's stream is not held back.
  mydevStream_t other = nullptr;
  OrderLog other_log;
  if (n > 1) {
    other = newStream(1, 0);
    other_log.launch(other, 1);
    syncWithin(other, 10, "a stream on another device");
    CHECK(other_log.order.size() == 1);
  }
  {
    std::lock_guard<std::mutex> lock(log.mu);
    CHECK(log.order.empty());
  }
  latch.released.store(true);
  syncWithin(high, 10, "high-priority stream");
  syncWithin(low, 10, "low-priority stream");
  syncWithin(nullptr, 10, "default stream");
  CHECK(log.order.size() == 10);
  for (int i = 0; i < 4; ++i) CHECK(log.order[static_cast<size_t>(i)] == 20 + i);
  for (int i = 0; i < 3; ++i) CHECK(log.indexOf(10 + i) < log.indexOf(11 + i));

  // A task already running is not pre-empted, and the held-back stream resumes
  // once the high-priority stream has nothing runnable.
  log.clear();
  Latch low_latch;
  CHECK_OK(mydevLaunchHostFunc(low, latchKernel, &low_latch));
  low_latch.waitStarted();
  launch(low, 10);
  launch(high, 20);
  syncWithin(high, 10, "high-priority stream beside a running low-priority task");
  low_latch.released.store(true);
  syncWithin(low, 10, "low-priority stream after its running task");
  CHECK((log.order == std::vector<int>{20, 10}));

  if (other) CHECK_OK(mydevStreamDestroy(other));
  CHECK_OK(mydevStreamDestroy(low));
  CHECK_OK(mydevStreamDestroy(high));
}

// A high-priority stream that waits for lower-priority work (an event, a
// synchronisation inside a kernel, an inline caller) does not hold that work
// back: everything completes.
void testPriorityNoDeadlock() {
  const bool blocking = launchBlocking();
  mydevStream_t low = newStream(0, 0);
  mydevStream_t high = newStream(0, -1);
  CHECK_OK(mydevSetDevice(0));
  OrderLog log;
  auto launch = [&](mydevStream_t s, int id) { log.launch(s, id); };

  // high: [held, H0, wait(E), H1, H2]; low: [L0, L1, record(E), L2].
  Latch latch;
  if (!blocking) {
    CHECK_OK(mydevLaunchHostFunc(high, latchKernel, &latch));
    latch.waitStarted();
  }
  launch(high, 20);
  launch(low, 10);
  launch(low, 11);
  mydevEvent_t ev = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&ev, mydevEventDisableTiming));
  CHECK_OK(mydevEventRecord(ev, low));
  launch(low, 12);
  CHECK_OK(mydevStreamWaitEvent(high, ev));
  launch(high, 21);
  launch(high, 22);
  latch.released.store(true);
  syncWithin(high, 10, "high-priority stream waiting for a low-priority event");
  syncWithin(low, 10, "low-priority stream recording the event");
  CHECK(log.order.size() == 6);
  CHECK(log.indexOf(20) < log.indexOf(10));  // held back while the high stream was runnable
  CHECK(log.indexOf(11) < log.indexOf(21));  // the event's work came first
  CHECK(log.indexOf(21) < log.indexOf(22));
  CHECK(log.indexOf(11) < log.indexOf(12));
  CHECK_OK(mydevEventDestroy(ev));

  // A high-priority kernel synchronising a low-priority stream.
  log.clear();
  struct SyncProbe {
    mydevStream_t target;
    OrderLog* log;
    mydevError_t rc = mydevErrorNotReady;
  } probe{low, &log};
  auto syncKernel = [](void* ud) {
    auto* p = static_cast<SyncProbe*>(ud);
    p->rc = mydevStreamSynchronize(p->target);
    p->log->push(29);
    return 0;
  };
  Latch latch2;
  if (!blocking) {
    CHECK_OK(mydevLaunchHostFunc(high, latchKernel, &latch2));
    latch2.waitStarted();
  }
  launch(low, 10);
  launch(low, 11);
  CHECK_OK(mydevLaunchHostFunc(high, syncKernel, &probe));
  launch(high, 20);
  latch2.released.store(true);
  syncWithin(high, 10, "high-priority kernel synchronising a low-priority stream");
  CHECK_OK(probe.rc);
  CHECK((log.order == std::vector<int>{10, 11, 29, 20}));

  if (!blocking) {
    // An inline caller holds the high stream: work queued behind it does not
    // hold back the low stream, which the inline function may be waiting for.
    log.clear();
    Latch inline_latch;
    mydevError_t inline_rc = mydevErrorNotReady;
    std::thread caller([&] { inline_rc = mydevLaunchHostFuncInline(high, latchKernel, &inline_latch); });
    inline_latch.waitStarted();
    launch(high, 20);
    launch(low, 10);
    syncWithin(low, 10, "low-priority stream beside a held inline call");
    CHECK((log.order == std::vector<int>{10}));
    inline_latch.released.store(true);
    caller.join();
    CHECK_OK(inline_rc);
    syncWithin(high, 10, "high-priority stream after its inline call");

    // An inline call on a low-priority stream runs at once, even while a
    // high-priority stream is runnable: it runs on the calling host thread.
    Latch latch3;
    CHECK_OK(mydevLaunchHostFunc(high, latchKernel, &latch3));
    latch3.waitStarted();
    launch(high, 21);
    std::atomic<int> flag{0};
    CHECK_OK(mydevLaunchHostFuncInline(low, setFlagKernel, &flag));
    CHECK(flag.load() == 1);
    latch3.released.store(true);
    syncWithin(high, 10, "high-priority stream after a low-priority inline call");

    // Destroying a held-back stream drains it once the high stream is done.
    Latch latch4;
    CHECK_OK(mydevLaunchHostFunc(high, latchKernel, &latch4));
    latch4.waitStarted();
    launch(high, 22);
    CHECK_OK(mydevLaunchHostFunc(high, noopKernel, nullptr));  // see testPriorityOrder
    launch(low, 11);
    std::thread releaser([&] {
      // Releases only once the destroy below is waiting (its stream is gone from the table).
      while (mydevStreamQuery(low) != mydevErrorInvalidResourceHandle) std::this_thread::yield();
      latch4.released.store(true);
    });
    CHECK_OK(mydevStreamDestroy(low));
    releaser.join();
    CHECK(log.indexOf(22) < log.indexOf(11));
    syncWithin(high, 10, "high-priority stream after a destroy");
  } else {
    CHECK_OK(mydevStreamDestroy(low));
  }
  CHECK_OK(mydevStreamDestroy(high));
}

// Only in blocking mode (MYDEV_LAUNCH_BLOCKING=1).
void testLaunchBlocking() {
  CHECK(launchBlocking());
  CHECK(mydevLaunchBlocking() != 0);
  mydevStream_t s = newStream();
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
  std::atomic<int> flag{0};
  auto t0 = std::chrono::steady_clock::now();
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  CHECK(flag.load() == 1);  // complete when the launch returned, despite the delay
  CHECK(msSince(t0) >= kDelayUs / 1000.0);
  CHECK_OK(mydevStreamQuery(s));
  std::atomic<int> failures{0};
  CHECK_ERR(mydevLaunchHostFuncLabeled(s, failingKernel, &failures, "blocking failure"),
            mydevErrorLaunchFailure);
  CHECK(failures == 1);
  CHECK(errorLabel(s) == "blocking failure");  // available before any synchronisation
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);  // still sticky too
  CHECK_OK(mydevStreamSynchronize(s));

  // Copies, memsets and records are complete on return too.
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 64));
  CHECK_OK(mydevMemsetAsync(d, 0x5c, 64, s));
  unsigned char out[64] = {};
  CHECK_OK(mydevMemcpyAsync(out, d, 64, mydevMemcpyDeviceToHost, s));
  for (unsigned char c : out) CHECK(c == 0x5c);
  mydevEvent_t ev = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&ev, 0));
  CHECK_OK(mydevEventRecord(ev, s));
  CHECK_OK(mydevEventQuery(ev));
  CHECK_OK(mydevEventDestroy(ev));
  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevStreamDestroy(s));
}

void testCopiesOrderedWithLaunches() {
  const int n = 1024;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, n * sizeof(int)));
  mydevStream_t s = newStream();
  CHECK_OK(mydevTestSetStreamDelay(s, 2000));
  struct Fill {
    int* dev;
    int n;
    int value;
  };
  auto fill = [](void* p) {
    auto* f = static_cast<Fill*>(p);
    int* dev = static_cast<int*>(mydevKernelAddress(f->dev));
    for (int i = 0; i < f->n; ++i) dev[i] = f->value + i;
    return 0;
  };
  auto check = [](void* p) {
    auto* f = static_cast<Fill*>(p);
    const int* dev = static_cast<const int*>(mydevKernelAddress(f->dev));
    for (int i = 0; i < f->n; ++i) {
      if (dev[i] != f->value + i) return 1;
    }
    return 0;
  };
  Fill f1{static_cast<int*>(d), n, 100}, f2{static_cast<int*>(d), n, 200}, f3{static_cast<int*>(d), n, 300};
  std::vector<int> h1(n), h2(n), h3(n, -1), src(n);
  for (int i = 0; i < n; ++i) src[i] = 300 + i;
  CHECK_OK(mydevLaunchHostFunc(s, fill, &f1));
  CHECK_OK(mydevMemcpyAsync(h1.data(), d, n * sizeof(int), mydevMemcpyDeviceToHost, s));
  CHECK_OK(mydevLaunchHostFunc(s, fill, &f2));
  CHECK_OK(mydevMemcpyAsync(h2.data(), d, n * sizeof(int), mydevMemcpyDeviceToHost, s));
  CHECK_OK(mydevMemsetAsync(d, 0, n * sizeof(int), s));
  CHECK_OK(mydevMemcpyAsync(d, src.data(), n * sizeof(int), mydevMemcpyHostToDevice, s));
  CHECK_OK(mydevLaunchHostFunc(s, check, &f3));  // sees the host-to-device copy
  CHECK_OK(mydevMemsetAsync(d, 0xff, sizeof(int), s));
  CHECK_OK(mydevMemcpyAsync(h3.data(), d, n * sizeof(int), mydevMemcpyDeviceToHost, s));
  CHECK_OK(mydevStreamSynchronize(s));  // also: the check launch did not fail
  for (int i = 0; i < n; ++i) {
    CHECK(h1[i] == 100 + i);
    CHECK(h2[i] == 200 + i);
  }
  CHECK(h3[0] == -1);
  for (int i = 1; i < n; ++i) CHECK(h3[i] == 300 + i);
  CHECK_OK(mydevStreamDestroy(s));
  CHECK_OK(mydevFree(d));
}

// Runtime calls from inside launched functions: nested enqueues and
// synchronisation of the calling stream itself must not deadlock.
struct Nested {
  std::atomic<int> order{0};
  int inner_seen = -1;
  mydevError_t sync_result = mydevErrorNotReady;
  mydevError_t launch_result = mydevErrorNotReady;
};

int nestedInner(void* p) {
  auto* n = static_cast<Nested*>(p);
  n->inner_seen = n->order.fetch_add(1);
  return 0;
}

int nestedOuter(void* p) {
  auto* n = static_cast<Nested*>(p);
  n->order.fetch_add(1);
  n->launch_result = mydevLaunchHostFunc(nullptr, nestedInner, n);  // own (default) stream
  n->sync_result = mydevStreamSynchronize(nullptr);                // does not wait for itself
  return 0;
}

void testNestedRuntimeCalls() {
  const int n = deviceCount();
  CHECK_OK(mydevSetDevice(n - 1));
  Nested nested;
  CHECK_OK(mydevLaunchHostFunc(nullptr, nestedOuter, &nested));  // default stream of device n - 1
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK_OK(mydevStreamSynchronize(nullptr));  // the nested launch, if it was still queued
  CHECK(nested.launch_result == mydevSuccess);
  CHECK(nested.sync_result == mydevSuccess);
  CHECK(nested.inner_seen == 1);  // ran after its launcher, in stream order
  CHECK_OK(mydevSetDevice(0));

  // Destroying a stream from one of its own tasks. Once destroyed, no
  // synchronisation covers the stream, hence the atomic handshake.
  struct SelfDestroy {
    mydevStream_t stream;
    std::atomic<int> result;
  } sd{newStream(), {-1}};
  CHECK_OK(mydevLaunchHostFunc(sd.stream, [](void* p) {
    auto* x = static_cast<SelfDestroy*>(p);
    x->result.store(mydevStreamDestroy(x->stream));
    return 0;
  }, &sd));
  auto t0 = std::chrono::steady_clock::now();
  while (sd.result.load() == -1 && msSince(t0) < 10000) std::this_thread::yield();
  CHECK(sd.result.load() == mydevSuccess);
  std::atomic<int> flag{0};
  CHECK_ERR(mydevLaunchHostFunc(sd.stream, setFlagKernel, &flag), mydevErrorInvalidResourceHandle);
}

// Destroying a stream while other threads enqueue on it: every enqueue either
// succeeds (and its work runs before Destroy returns) or fails cleanly.
void testDestroyWhileEnqueuing() {
  for (int round = 0; round < 20; ++round) {
    mydevStream_t s = newStream();
    std::atomic<int> ran{0}, accepted{0}, rejected{0}, other{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < 3; ++t) {
      pool.emplace_back([&] {
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < 200; ++i) {
          mydevError_t e = mydevLaunchHostFunc(s, setFlagKernel, &ran);
          if (e == mydevSuccess) accepted++;
          else if (e == mydevErrorInvalidResourceHandle) rejected++;
          else other++;
        }
      });
    }
    go.store(true);
    std::this_thread::sleep_for(std::chrono::microseconds(50 * round));
    CHECK_OK(mydevStreamDestroy(s));
    for (auto& th : pool) th.join();
    CHECK(other.load() == 0);
    CHECK(accepted.load() + rejected.load() == 600);
    CHECK(ran.load() == accepted.load());
  }
}

// Many host threads on shared streams of every device: each stream runs its
// work one task at a time, on its device, and in each producer's order.
struct StressLog {
  int device = 0;
  std::atomic<bool> busy{false};
  std::atomic<int> errors{0};
  std::vector<int> last_seq;  // per producer thread; only the stream's worker touches it
  long count = 0;             // likewise
};

struct StressRec {
  StressLog* log;
  int thread;
  int seq;
};

int stressKernel(void* p) {
  auto* r = static_cast<StressRec*>(p);
  StressLog* log = r->log;
  if (log->busy.exchange(true)) log->errors++;
  int dev = -1;
  mydevGetDevice(&dev);
  if (dev != log->device) log->errors++;
  if (r->seq != log->last_seq[r->thread] + 1) log->errors++;
  log->last_seq[r->thread] = r->seq;
  log->count++;
  log->busy.store(false);
  return 0;
}

void testStress() {
  const int threads = 8, per_device = 1000;
  const int n = std::min(deviceCount(), 2);
  // Per device: the default stream and one created stream, shared by all threads.
  std::vector<mydevStream_t> created(n);
  std::vector<StressLog> logs(2 * n);
  for (int d = 0; d < n; ++d) {
    created[d] = newStream(d, -(d % 2));
    for (int k = 0; k < 2; ++k) {
      logs[2 * d + k].device = d;
      logs[2 * d + k].last_seq.assign(threads, -1);
    }
  }
  std::vector<StressRec> recs(static_cast<size_t>(threads) * n * per_device);
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<int> seq(2 * n, 0);
      for (int i = 0; i < per_device; ++i) {
        for (int d = 0; d < n; ++d) {
          if (mydevSetDevice(d) != mydevSuccess) failures++;
          int k = (i + t) % 2;
          StressLog* log = &logs[2 * d + k];
          StressRec* r = &recs[(static_cast<size_t>(t) * n + d) * per_device + i];
          *r = StressRec{log, t, seq[2 * d + k]++};
          if (mydevLaunchHostFunc(k ? created[d] : nullptr, stressKernel, r) != mydevSuccess) failures++;
          if (i % 97 == 0 && mydevStreamQuery(created[d]) == mydevErrorInvalidResourceHandle) failures++;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  for (int d = 0; d < n; ++d) {
    CHECK_OK(mydevSetDevice(d));
    CHECK_OK(mydevDeviceSynchronize());
  }
  CHECK_OK(mydevSetDevice(0));
  long total = 0;
  for (auto& log : logs) {
    CHECK(log.errors.load() == 0);
    total += log.count;
  }
  CHECK(total == static_cast<long>(threads) * n * per_device);
  for (int d = 0; d < n; ++d) {
    for (int k = 0; k < 2; ++k) {
      // Each thread sent half its launches for device d to each stream.
      long expected = 0;
      for (int t = 0; t < threads; ++t) {
        int mine = 0;
        for (int i = 0; i < per_device; ++i) mine += ((i + t) % 2 == k);
        CHECK(logs[2 * d + k].last_seq[t] == mine - 1);
        expected += mine;
      }
      CHECK(logs[2 * d + k].count == expected);
    }
    CHECK_OK(mydevStreamDestroy(created[d]));
  }
}

// ---- launch queue depth ----------------------------------------------------

// MYDEV_LAUNCH_QUEUE_DEPTH as the runtime reads it (0: no limit).
size_t launchQueueDepth() {
  const char* v = std::getenv("MYDEV_LAUNCH_QUEUE_DEPTH");
  return v && *v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : 1024;
}

// Polls until pred() holds, failing the test (instead of hanging it) after
// `seconds`: a deadlock shows as this failure.
template <class Pred>
void waitWithin(Pred pred, int seconds, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "%s: still waiting after %d s (deadlock)\n", what, seconds);
      std::fflush(stderr);
      _exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Checks that each task runs in launch order: task i must be the i-th to run.
struct SeqLog {
  std::vector<int> ids;  // the ids launched, in order; items point into it
  std::atomic<int> next{0};
  std::atomic<int> errors{0};
  struct Item {
    SeqLog* log;
    int index;
  };
  std::deque<Item> items;
  static int kernel(void* ud) {
    auto* it = static_cast<Item*>(ud);
    if (it->log->next.fetch_add(1) != it->index) it->log->errors++;
    return 0;
  }
  Item* add() {
    items.push_back(Item{this, static_cast<int>(items.size())});
    return &items.back();
  }
};

// A stream holding `depth` queued tasks makes the next enqueue (a launch, an
// async memset or an event record) wait until the worker has started some;
// afterwards everything runs in FIFO order. Needs a small depth.
void testQueueDepthBlocksSubmitter() {
  const size_t depth = launchQueueDepth();
  CHECK(depth >= 1 && depth <= 64);
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 64));
  mydevEvent_t ev = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&ev, 0));
  for (int kind = 0; kind < 3; ++kind) {
    mydevStream_t s = newStream();
    Latch latch;
    CHECK_OK(mydevLaunchHostFunc(s, latchKernel, &latch));
    latch.waitStarted();  // running: no longer queued
    // Enqueue number `depth` is the one that must wait: a launch, a memset or an event record.
    SeqLog log;
    const int total = static_cast<int>(3 * depth);
    const int launches = kind == 0 ? total : total - 1;
    for (int i = 0; i < launches; ++i) log.add();  // before the helper starts: items stay put
    std::atomic<int> returned{0}, failures{0};
    std::atomic<bool> released_at_return{false};
    std::thread submitter([&] {
      size_t next_item = 0;
      for (int i = 0; i < total; ++i) {
        mydevError_t rc;
        if (static_cast<size_t>(i) == depth && kind == 1) {
          rc = mydevMemsetAsync(d, 7, 64, s);
        } else if (static_cast<size_t>(i) == depth && kind == 2) {
          rc = mydevEventRecord(ev, s);
        } else {
          rc = mydevLaunchHostFunc(s, SeqLog::kernel, &log.items[next_item++]);
        }
        if (rc != mydevSuccess) failures++;
        if (static_cast<size_t>(i) == depth) released_at_return.store(latch.released.load());
        returned++;
      }
    });
    // The first `depth` enqueues fill the queue without waiting ...
    waitWithin([&] { return returned.load() >= static_cast<int>(depth); }, 10, "filling the launch queue");
    // ... and the next one waits for the held worker. (A bounded wait: a wrong
    // implementation returns at once and fails the check below regardless.)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(returned.load() == static_cast<int>(depth));
    latch.released.store(true);
    submitter.join();
    CHECK(failures.load() == 0);
    CHECK(released_at_return.load());  // it returned only after the worker moved on
    syncWithin(s, 10, "a stream after its launch queue filled");
    // Everything ran, once, in launch order (the memset / record took slot `depth`).
    CHECK(log.errors.load() == 0);
    CHECK(log.next.load() == launches);
    if (kind == 1) {
      unsigned char back[64];
      CHECK_OK(mydevMemcpy(back, d, 64, mydevMemcpyDeviceToHost));
      CHECK(back[0] == 7 && back[63] == 7);
    }
    if (kind == 2) CHECK_OK(mydevEventQuery(ev));
    CHECK_OK(mydevStreamDestroy(s));
  }
  CHECK_OK(mydevEventDestroy(ev));
  CHECK_OK(mydevFree(d));
}

// Work enqueuing onto its own full stream never waits (it would wait for
// itself), from a launched function or an inline function.
struct SelfEnqueue {
  mydevStream_t stream = nullptr;
  SeqLog* log = nullptr;
  int first = 0, count = 0;
  std::atomic<bool> started{false}, go{false};
  std::atomic<int> failures{0};
  static int kernel(void* ud) {
    auto* p = static_cast<SelfEnqueue*>(ud);
    p->started.store(true);
    while (!p->go.load()) std::this_thread::yield();
    for (int i = 0; i < p->count; ++i) {
      if (mydevLaunchHostFunc(p->stream, SeqLog::kernel, &p->log->items[static_cast<size_t>(p->first + i)]) !=
          mydevSuccess) {
        p->failures++;
      }
    }
    return 0;
  }
};

void testQueueDepthOwnStreamDoesNotWait() {
  const int depth = static_cast<int>(launchQueueDepth());
  // From a launched function: the queue is [probe, depth - 1 tasks] when the
  // held worker is released, and the probe adds 2 * depth more.
  {
    mydevStream_t s = newStream();
    SeqLog log;
    for (int i = 0; i < 3 * depth - 1; ++i) log.add();
    SelfEnqueue probe;
    probe.stream = s;
    probe.log = &log;
    probe.first = depth - 1;
    probe.count = 2 * depth;
    probe.go.store(true);
    Latch latch;
    CHECK_OK(mydevLaunchHostFunc(s, latchKernel, &latch));
    latch.waitStarted();
    CHECK_OK(mydevLaunchHostFunc(s, SelfEnqueue::kernel, &probe));
    for (int i = 0; i < depth - 1; ++i) CHECK_OK(mydevLaunchHostFunc(s, SeqLog::kernel, &log.items[i]));
    latch.released.store(true);
    syncWithin(s, 10, "a task enqueuing onto its own full stream");
    CHECK(probe.failures.load() == 0);
    CHECK(log.errors.load() == 0);
    CHECK(log.next.load() == 3 * depth - 1);
    CHECK_OK(mydevStreamDestroy(s));
  }
  // From an inline function, which holds the worker: this thread fills the
  // queue meanwhile, then the function adds 2 * depth more.
  {
    mydevStream_t s = newStream();
    SeqLog log;
    for (int i = 0; i < 3 * depth; ++i) log.add();
    SelfEnqueue probe;
    probe.stream = s;
    probe.log = &log;
    probe.first = depth;
    probe.count = 2 * depth;
    std::atomic<bool> done{false};
    mydevError_t inline_rc = mydevErrorNotReady;
    std::thread caller([&] {
      inline_rc = mydevLaunchHostFuncInline(s, SelfEnqueue::kernel, &probe);
      done.store(true);
    });
    waitWithin([&] { return probe.started.load(); }, 10, "an inline function starting");
    for (int i = 0; i < depth; ++i) CHECK_OK(mydevLaunchHostFunc(s, SeqLog::kernel, &log.items[i]));
    probe.go.store(true);
    waitWithin([&] { return done.load(); }, 10, "an inline function enqueuing onto its own full stream");
    caller.join();
    CHECK_OK(inline_rc);
    CHECK(probe.failures.load() == 0);
    syncWithin(s, 10, "a stream after an inline function overfilled it");
    CHECK(log.errors.load() == 0);
    CHECK(log.next.load() == 3 * depth);
    CHECK_OK(mydevStreamDestroy(s));
  }
}

// A high-priority worker waiting for room in a full low-priority stream is
// blocked for the scheduler: its own queued work no longer holds the device's
// lower-priority streams back, so the full stream drains and nothing deadlocks.
void testQueueDepthCrossStreamWaitIsBlocked() {
  const int depth = static_cast<int>(launchQueueDepth());
  if (depth < 2) return;  // high's queue must hold the probe and a task behind it
  CHECK_OK(mydevSetDevice(0));
  mydevStream_t low = newStream(0, 0), high = newStream(0, -1), other = newStream(0, 0);
  SeqLog log;
  for (int i = 0; i <= depth; ++i) log.add();
  struct Probe {
    mydevStream_t target;
    SeqLog::Item* item;
    std::atomic<bool> returned{false};
    mydevError_t rc = mydevErrorNotReady;
  } probe{low, &log.items[static_cast<size_t>(depth)]};
  auto enqueueKernel = [](void* ud) {
    auto* p = static_cast<Probe*>(ud);
    p->rc = mydevLaunchHostFunc(p->target, SeqLog::kernel, p->item);
    p->returned.store(true);
    return 0;
  };
  Latch low_latch, high_latch;
  CHECK_OK(mydevLaunchHostFunc(low, latchKernel, &low_latch));
  low_latch.waitStarted();
  for (int i = 0; i < depth; ++i) CHECK_OK(mydevLaunchHostFunc(low, SeqLog::kernel, &log.items[i]));  // full
  CHECK_OK(mydevLaunchHostFunc(high, latchKernel, &high_latch));
  high_latch.waitStarted();
  CHECK_OK(mydevLaunchHostFunc(high, enqueueKernel, &probe));
  CHECK_OK(mydevLaunchHostFunc(high, noopKernel, nullptr));  // keeps high's queue non-empty
  // Held back while high is runnable.
  std::atomic<int> other_ran{0};
  CHECK_OK(mydevLaunchHostFunc(other, setFlagKernel, &other_ran));
  high_latch.released.store(true);
  // high's worker now waits for room in `low`, which stays full while its
  // worker is held: only that wait (counted as blocked) lets `other` run.
  waitWithin([&] { return other_ran.load() == 1; }, 10, "a low-priority stream beside a high-priority worker waiting for room");
  CHECK(!probe.returned.load());  // still waiting: had it enqueued past the limit, high would have drained first
  low_latch.released.store(true);
  syncWithin(high, 10, "a high-priority stream waiting for room in a low-priority one");
  syncWithin(low, 10, "a low-priority stream drained for a high-priority submitter");
  CHECK_OK(probe.rc);
  CHECK(log.errors.load() == 0);
  CHECK(log.next.load() == depth + 1);
  CHECK_OK(mydevStreamDestroy(other));
  CHECK_OK(mydevStreamDestroy(high));
  CHECK_OK(mydevStreamDestroy(low));
}

// Two streams' tasks each enqueue onto the other's full stream at the same
// time: one of them must go past the limit instead of waiting, or neither
// stream ever drains.
struct CrossFeed {
  mydevStream_t self = nullptr, peer = nullptr;
  SeqLog* own_log = nullptr;  // items[0]: the task this one adds to its own stream
  SeqLog* peer_log = nullptr;  // items[depth]: the task it adds to the peer
  int depth = 0;
  std::atomic<bool>* ready_self = nullptr;
  std::atomic<bool>* ready_peer = nullptr;
  mydevError_t own_rc = mydevErrorNotReady, peer_rc = mydevErrorNotReady;
  static int kernel(void* ud) {
    auto* p = static_cast<CrossFeed*>(ud);
    // Refill its own queue (never waits: own stream), so both are full below.
    p->own_rc = mydevLaunchHostFunc(p->self, SeqLog::kernel, &p->own_log->items[static_cast<size_t>(p->depth) - 1]);
    p->ready_self->store(true);
    while (!p->ready_peer->load()) std::this_thread::yield();
    p->peer_rc = mydevLaunchHostFunc(p->peer, SeqLog::kernel, &p->peer_log->items[static_cast<size_t>(p->depth)]);
    return 0;
  }
};

void testQueueDepthCrossFeedDoesNotDeadlock() {
  const int depth = static_cast<int>(launchQueueDepth());
  mydevStream_t a = newStream(), b = newStream();
  SeqLog log_a, log_b;
  for (int i = 0; i <= depth; ++i) {
    log_a.add();
    log_b.add();
  }
  std::atomic<bool> ready_a{false}, ready_b{false};
  CrossFeed feed_a, feed_b;
  feed_a.self = a;
  feed_a.peer = b;
  feed_a.own_log = &log_a;
  feed_a.peer_log = &log_b;
  feed_a.ready_self = &ready_a;
  feed_a.ready_peer = &ready_b;
  feed_b.self = b;
  feed_b.peer = a;
  feed_b.own_log = &log_b;
  feed_b.peer_log = &log_a;
  feed_b.ready_self = &ready_b;
  feed_b.ready_peer = &ready_a;
  feed_a.depth = feed_b.depth = depth;
  // Each queue: [feed, depth - 1 tasks] behind a held worker; once released,
  // each feed refills its own queue to depth before feeding the other.
  Latch latch_a, latch_b;
  CHECK_OK(mydevLaunchHostFunc(a, latchKernel, &latch_a));
  CHECK_OK(mydevLaunchHostFunc(b, latchKernel, &latch_b));
  latch_a.waitStarted();
  latch_b.waitStarted();
  CHECK_OK(mydevLaunchHostFunc(a, CrossFeed::kernel, &feed_a));
  CHECK_OK(mydevLaunchHostFunc(b, CrossFeed::kernel, &feed_b));
  for (int i = 0; i < depth - 1; ++i) {
    CHECK_OK(mydevLaunchHostFunc(a, SeqLog::kernel, &log_a.items[i]));
    CHECK_OK(mydevLaunchHostFunc(b, SeqLog::kernel, &log_b.items[i]));
  }
  latch_a.released.store(true);
  latch_b.released.store(true);
  syncWithin(a, 10, "two streams' tasks feeding each other's full queues (a)");
  syncWithin(b, 10, "two streams' tasks feeding each other's full queues (b)");
  // feed_b may have enqueued its task onto a only after a's synchronisation
  // above took its snapshot; it has now (b is drained), so wait for it too.
  syncWithin(a, 10, "two streams' tasks feeding each other's full queues (a, again)");
  CHECK_OK(feed_a.own_rc);
  CHECK_OK(feed_a.peer_rc);
  CHECK_OK(feed_b.own_rc);
  CHECK_OK(feed_b.peer_rc);
  CHECK(log_a.errors.load() == 0 && log_b.errors.load() == 0);
  CHECK(log_a.next.load() == depth + 1 && log_b.next.load() == depth + 1);
  CHECK_OK(mydevStreamDestroy(a));
  CHECK_OK(mydevStreamDestroy(b));
}

// Destroying a stream releases a submitter waiting for room in it: its
// enqueue fails with mydevErrorInvalidResourceHandle (the stream is gone) and
// its work never runs; the work queued before still does.
void testQueueDepthDestroyReleasesSubmitter() {
  const int depth = static_cast<int>(launchQueueDepth());
  mydevStream_t s = newStream();
  Latch latch;
  CHECK_OK(mydevLaunchHostFunc(s, latchKernel, &latch));
  latch.waitStarted();
  std::atomic<int> ran{0};
  std::atomic<bool> attempting{false}, done{false};
  mydevError_t last_rc = mydevErrorNotReady;
  std::atomic<int> failures{0};
  std::thread submitter([&] {
    for (int i = 0; i < depth; ++i) {
      if (mydevLaunchHostFunc(s, setFlagKernel, &ran) != mydevSuccess) failures++;
    }
    attempting.store(true);
    last_rc = mydevLaunchHostFunc(s, setFlagKernel, &ran);  // waits for room
    done.store(true);
  });
  // The worker stays held until the submitter is released: only the destroy can release it.
  std::thread releaser([&] {
    waitWithin([&] { return done.load(); }, 10, "a submitter waiting for room in a destroyed stream");
    latch.released.store(true);
  });
  waitWithin([&] { return attempting.load(); }, 10, "filling the launch queue");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // usually waiting by now; either way it must fail
  CHECK_OK(mydevStreamDestroy(s));
  releaser.join();
  submitter.join();
  CHECK(failures.load() == 0);
  CHECK_ERR(last_rc, mydevErrorInvalidResourceHandle);
  CHECK(ran.load() == depth);
}

// Far more launches than the queue holds, behind a worker held at first:
// the host waits for room as needed and every task runs, in order.
void testManyLaunchesBeyondQueueDepth() {
  const bool blocking = launchBlocking();
  mydevStream_t s = newStream();
  SeqLog log;
  const int total = 10000;
  for (int i = 0; i < total; ++i) log.add();
  Latch latch;
  std::thread releaser;
  if (!blocking) {  // a held kernel would hold this thread under MYDEV_LAUNCH_BLOCKING=1
    CHECK_OK(mydevLaunchHostFunc(s, latchKernel, &latch));
    latch.waitStarted();
    // Only there to let the queue fill first; the checks do not depend on it.
    releaser = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      latch.released.store(true);
    });
  }
  int failures = 0;
  for (int i = 0; i < total; ++i) failures += mydevLaunchHostFunc(s, SeqLog::kernel, &log.items[i]) != mydevSuccess;
  if (releaser.joinable()) releaser.join();
  syncWithin(s, 30, "many launches beyond the queue depth");
  CHECK(failures == 0);
  CHECK(log.errors.load() == 0);
  CHECK(log.next.load() == total);
  CHECK_OK(mydevStreamDestroy(s));
}

// ---- concurrency ----------------------------------------------------------

void testManyThreads() {
  const int threads = 8, iterations = 150;
  const int n = deviceCount();
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto expect = [&](bool ok) {
        if (!ok) failures.fetch_add(1);
      };
      expect(mydevSetDevice(t % n) == mydevSuccess);
      mydevStream_t s = nullptr;
      expect(mydevStreamCreateWithPriority(&s, -(t % 2)) == mydevSuccess);
      mydevEvent_t ev = nullptr;
      expect(mydevEventCreateWithFlags(&ev, 0) == mydevSuccess);
      for (int i = 0; i < iterations; ++i) {
        size_t bytes = 1 + static_cast<size_t>((t * 7919 + i * 104729) % 20000);
        std::vector<unsigned char> in(bytes), out(bytes);
        fillPattern(in, static_cast<unsigned>(t * 1000 + i));
        void* d = nullptr;
        expect(mydevMalloc(&d, bytes) == mydevSuccess);
        expect(mydevMemcpyAsync(d, in.data(), bytes, mydevMemcpyHostToDevice, s) == mydevSuccess);
        expect(mydevLaunchHostFunc(s, [](void* p) { return *static_cast<unsigned char*>(p) == 0xff ? 0 : 0; },
                                   d) == mydevSuccess);
        expect(mydevEventRecord(ev, s) == mydevSuccess);
        expect(mydevMemcpyAsync(out.data(), d, bytes, mydevMemcpyDeviceToHost, s) == mydevSuccess);
        expect(mydevStreamSynchronize(s) == mydevSuccess);
        expect(in == out);
        mydevPointerAttributes attr;
        expect(mydevPointerGetAttributes(&attr, d) == mydevSuccess && attr.base == d && attr.size == bytes &&
               attr.device == t % n);
        expect(mydevFree(d) == mydevSuccess);
      }
      expect(mydevEventDestroy(ev) == mydevSuccess);
      expect(mydevStreamDestroy(s) == mydevSuccess);
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  for (int d = 0; d < n; ++d) CHECK(freeBytes(d) == limitBytes());
}

// ---- fork after initialisation ------------------------------------------------

void testForkAfterInitIsPoisoned() {
  CHECK_OK(mydevSetDevice(0));  // make sure we are initialised
  void* d = nullptr;
  void* h = nullptr;
  CHECK_OK(mydevMalloc(&d, 128));
  CHECK_OK(mydevHostAlloc(&h, 128));
  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, 0));
  const int n = deviceCount();
  // Workers exist, and one is busy when the process forks.
  std::atomic<int> flag{0};
  CHECK_OK(mydevTestSetStreamDelay(s, 20000));
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));

  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int count = 0;
    CHILD_CHECK(mydevGetDeviceCount(&count) == mydevSuccess, 10);
    CHILD_CHECK(count == n, 11);
    void* p = nullptr;
    CHILD_CHECK(mydevMalloc(&p, 16) == mydevErrorInitializationError, 12);
    CHILD_CHECK(p == nullptr, 13);
    CHILD_CHECK(mydevSetDevice(0) == mydevErrorInitializationError, 14);
    int dev = 0;
    CHILD_CHECK(mydevGetDevice(&dev) == mydevErrorInitializationError, 15);
    char buf[16];
    CHILD_CHECK(mydevMemcpy(buf, d, 16, mydevMemcpyDeviceToHost) == mydevErrorInitializationError, 16);
    CHILD_CHECK(mydevStreamSynchronize(s) == mydevErrorInitializationError, 17);
    mydevStream_t s2 = nullptr;
    CHILD_CHECK(mydevStreamCreateWithPriority(&s2, 0) == mydevErrorInitializationError, 18);
    CHILD_CHECK(mydevDeviceSynchronize() == mydevErrorInitializationError, 19);
    mydevPointerAttributes attr;
    CHILD_CHECK(mydevPointerGetAttributes(&attr, d) == mydevErrorInitializationError, 20);
    mydevEvent_t ev = nullptr;
    CHILD_CHECK(mydevEventCreateWithFlags(&ev, 0) == mydevErrorInitializationError, 21);
    // Destructors of inherited objects must not fail.
    CHILD_CHECK(mydevFree(d) == mydevSuccess, 22);
    CHILD_CHECK(mydevFreeHost(h) == mydevSuccess, 23);
    CHILD_CHECK(mydevIsInitialized() != 0, 24);
    CHILD_CHECK(std::strcmp(mydevGetErrorName(mydevErrorInitializationError),
                            "mydevErrorInitializationError") == 0,
                25);
    CHILD_CHECK(mydevLaunchHostFunc(s, setFlagKernel, &flag) == mydevErrorInitializationError, 26);
    CHILD_CHECK(mydevStreamQuery(s) == mydevErrorInitializationError, 27);
    _exit(0);
  }
  waitChildOk(pid);

  // A poisoned child that exits normally runs the exit handlers it inherited;
  // they must not wait for the parent's workers, which it does not have.
  std::fflush(nullptr);
  pid = fork();
  if (pid == 0) std::exit(0);
  waitChildOk(pid);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(flag.load() == 1);

  // The parent is unaffected, including the allocations the child "freed".
  void* p = nullptr;
  CHECK_OK(mydevMalloc(&p, 16));
  CHECK_OK(mydevMemcpy(p, d, 16, mydevMemcpyDeviceToDevice));
  CHECK_OK(mydevFree(p));
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_OK(mydevStreamDestroy(s));
  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevFreeHost(h));
}

// ---- strict mode (MYDEV_STRICT=1) -------------------------------------------

struct StrictArgs {
  unsigned char* dev;  // device address
  size_t bytes;
  bool readable_inside = false;        // the kernel address, inside the kernel
  bool device_sealed_inside = false;   // the device address, inside the kernel
  void* allocated_inside = nullptr;
  bool readable_after_nested_copy = false;
};

int strictKernel(void* ud) {
  auto* a = static_cast<StrictArgs*>(ud);
  auto* k = static_cast<unsigned char*>(mydevKernelAddress(a->dev));
  a->readable_inside = hostReadable(k);
  a->device_sealed_inside = !hostReadable(a->dev);  // kernels too must translate
  for (size_t i = 0; i < a->bytes; ++i) k[i] = static_cast<unsigned char>(k[i] + 1);
  // Memory allocated inside a kernel is usable at once through its kernel address...
  if (mydevMalloc(&a->allocated_inside, 64) != mydevSuccess) return 1;
  std::memset(mydevKernelAddress(a->allocated_inside), 0x42, 64);
  // ... and a nested runtime copy changes nothing about what is accessible.
  unsigned char tmp[8];
  if (mydevMemcpy(tmp, a->dev, sizeof(tmp), mydevMemcpyDeviceToHost) != mydevSuccess) return 1;
  if (std::memcmp(tmp, k, sizeof(tmp)) != 0) return 1;
  a->readable_after_nested_copy = hostReadable(k) && !hostReadable(a->dev);
  return 0;
}

int runStrict() {
  CHECK(mydevStrictMode());
  const size_t n = 5000;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, n));
  CHECK(!hostReadable(d));  // sealed from birth
  CHECK(!hostReadable(static_cast<char*>(d) + n + 10));  // including the rounding tail

  std::vector<unsigned char> in(n), out(n);
  fillPattern(in, 5);
  CHECK_OK(mydevMemcpy(d, in.data(), n, mydevMemcpyHostToDevice));
  CHECK(!hostReadable(d));
  CHECK_OK(mydevMemcpy(out.data(), d, n, mydevMemcpyDeviceToHost));
  CHECK(out == in);

  StrictArgs args{static_cast<unsigned char*>(d), n};
  CHECK_OK(mydevLaunchHostFunc(nullptr, strictKernel, &args));
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK(args.readable_inside);
  CHECK(args.device_sealed_inside);
  CHECK(args.readable_after_nested_copy);
  CHECK(!hostReadable(d));  // never opened
  CHECK(args.allocated_inside != nullptr);
  CHECK(!hostReadable(args.allocated_inside));
  CHECK_OK(mydevMemcpy(out.data(), d, n, mydevMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) CHECK(out[i] == static_cast<unsigned char>(in[i] + 1));
  unsigned char inner[64];
  CHECK_OK(mydevMemcpy(inner, args.allocated_inside, 64, mydevMemcpyDeviceToHost));
  for (unsigned char c : inner) CHECK(c == 0x42);

  // Memset, device-to-device and cross-device copies work (through kernel addresses).
  void* e = nullptr;
  CHECK_OK(mydevMalloc(&e, n));
  CHECK_OK(mydevMemsetAsync(e, 9, n, nullptr));
  CHECK_OK(mydevMemcpy(d, e, n, mydevMemcpyDeviceToDevice));
  CHECK_OK(mydevMemcpy(out.data(), d, n, mydevMemcpyDeviceToHost));
  CHECK(out == std::vector<unsigned char>(n, 9));
  if (deviceCount() >= 2) {
    CHECK_OK(mydevSetDevice(1));
    void* f = nullptr;
    CHECK_OK(mydevMalloc(&f, n));
    CHECK(!hostReadable(f));
    CHECK_OK(mydevMemcpy(f, in.data(), n, mydevMemcpyHostToDevice));
    CHECK_OK(mydevSetDevice(0));
    CHECK_OK(mydevMemcpy(e, f, n, mydevMemcpyDeviceToDevice));
    CHECK_OK(mydevMemcpy(out.data(), e, n, mydevMemcpyDeviceToHost));
    CHECK(out == in);
    CHECK_OK(mydevFree(f));
  }
  CHECK(!hostReadable(d));
  CHECK(!hostReadable(e));

  // Pinned host memory is never protected.
  void* h = nullptr;
  CHECK_OK(mydevHostAlloc(&h, 100));
  CHECK(hostReadable(h));
  std::memset(h, 1, 100);
  CHECK_OK(mydevMemcpy(e, h, 100, mydevMemcpyHostToDevice));
  CHECK(hostReadable(h));

  // Concurrent launches and copies from several threads; device addresses
  // stay sealed throughout.
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&] {
      void* mine = nullptr;
      if (mydevMalloc(&mine, 256) != mydevSuccess) failures++;
      for (int i = 0; i < 200; ++i) {
        auto kernel = [](void* p) {
          auto* b = static_cast<unsigned char*>(mydevKernelAddress(p));
          for (int k = 0; k < 256; ++k) b[k] = static_cast<unsigned char>(k);
          return 0;
        };
        if (mydevLaunchHostFunc(nullptr, kernel, mine) != mydevSuccess) failures++;
        unsigned char back[256];
        if (mydevMemcpy(back, mine, 256, mydevMemcpyDeviceToHost) != mydevSuccess) failures++;
        if (back[255] != 255) failures++;
      }
      if (mydevFree(mine) != mydevSuccess) failures++;
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  CHECK(!hostReadable(d));

  // Kernels and async copies on other streams' workers (and devices) reach
  // memory through kernel addresses; device addresses are never opened.
  {
    mydevStream_t s = newStream(deviceCount() - 1);
    CHECK_OK(mydevTestSetStreamDelay(s, 2000));
    StrictArgs args2{static_cast<unsigned char*>(d), n};
    CHECK_OK(mydevMemsetAsync(d, 3, n, s));
    CHECK_OK(mydevLaunchHostFunc(s, strictKernel, &args2));  // d[i] = 4
    CHECK_OK(mydevMemcpyAsync(e, d, n, mydevMemcpyDeviceToDevice, s));
    CHECK_OK(mydevMemcpyAsync(out.data(), e, n, mydevMemcpyDeviceToHost, s));
    CHECK_OK(mydevStreamSynchronize(s));
    CHECK(args2.readable_inside);
    CHECK(args2.device_sealed_inside);
    CHECK(args2.readable_after_nested_copy);
    CHECK(out == std::vector<unsigned char>(n, 4));
    CHECK(!hostReadable(d));
    CHECK(!hostReadable(e));
    CHECK(!hostReadable(args2.allocated_inside));
    CHECK_OK(mydevFree(args2.allocated_inside));
    CHECK_OK(mydevStreamDestroy(s));
  }

  // While a kernel is provably running (blocked on a latch, holding its own
  // allocation's kernel address), device addresses stay sealed: of its
  // allocation and of any other.
  {
    struct Running {
      Latch latch;
      void* dev;
    } running{{}, d};
    mydevStream_t s = newStream();
    // Blocking: the launch returns only once the kernel finished, so it
    // cannot wait for us.
    if (launchBlocking()) running.latch.released.store(true);
    CHECK_OK(mydevLaunchHostFunc(s, [](void* p) {
      auto* r = static_cast<Running*>(p);
      static_cast<unsigned char*>(mydevKernelAddress(r->dev))[0] = 0x77;
      return latchKernel(&r->latch);
    }, &running));
    if (!launchBlocking()) {
      running.latch.waitStarted();
      CHECK(!hostReadable(d));
      CHECK(!hostReadable(e));
      CHECK(!hostReadable(static_cast<char*>(e) + n - 1));
      running.latch.released.store(true);
    }
    CHECK_OK(mydevStreamSynchronize(s));
    CHECK_OK(mydevStreamDestroy(s));
    unsigned char first = 0;
    CHECK_OK(mydevMemcpy(&first, d, 1, mydevMemcpyDeviceToHost));
    CHECK(first == 0x77);
  }

  // A child forked after allocating inherits neither view (MADV_DONTFORK): it
  // can neither read nor change the parent's device memory.
  {
    const size_t m = 2 * pageSize();
    void* f = nullptr;
    CHECK_OK(mydevMalloc(&f, m));
    auto* fk = static_cast<unsigned char*>(mydevKernelAddress(f));
    std::vector<unsigned char> pattern(m);
    fillPattern(pattern, 21);
    std::memcpy(fk, pattern.data(), m);
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      // Nothing is mapped at either address in the child: mapping fresh
      // memory there with MAP_FIXED_NOREPLACE succeeds, and writing it does
      // not reach the parent.
      void* at = mmap(fk, m, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      CHILD_CHECK(at == fk, 30);
      std::memset(at, 0xee, m);
      void* at2 = mmap(f, m, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      CHILD_CHECK(at2 == f, 31);
      std::memset(at2, 0xee, m);
      CHILD_CHECK(mydevKernelAddress(f) == f, 32);  // poisoned: nothing translated
      _exit(0);
    }
    waitChildOk(pid);
    // Touching the kernel address in a child faults (plain SIGSEGV: it is
    // not a device address, so there is no strict-mode report).
    std::fflush(nullptr);
    pid = fork();
    if (pid == 0) {
      volatile unsigned char v = *static_cast<volatile unsigned char*>(static_cast<void*>(fk + 1));
      (void)v;
      _exit(0);
    }
    CHECK(pid > 0);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    // (A sanitizer's own SIGSEGV handler turns the fault into an exit status.)
    CHECK(WIFSIGNALED(status) ? WTERMSIG(status) == SIGSEGV : WEXITSTATUS(status) != 0);
    CHECK(std::memcmp(fk, pattern.data(), m) == 0);
    std::vector<unsigned char> back(m);
    CHECK_OK(mydevMemcpy(back.data(), f, m, mydevMemcpyDeviceToHost));
    CHECK(back == pattern);
    CHECK_OK(mydevFree(f));
  }

  CHECK_OK(mydevFreeHost(h));
  CHECK_OK(mydevFree(args.allocated_inside));
  CHECK_OK(mydevFree(e));
  CHECK_OK(mydevFree(d));
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}

// Host code reading device memory: the handler must report it and abort.
// Prints the faulting address first so the caller can match the message.
int runStrictFault() {
  if (!mydevStrictMode()) return 2;
  int device = deviceCount() >= 2 ? 1 : 0;
  CHECK_OK(mydevSetDevice(device));
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 10000));
  // Device work on a worker first (through the kernel address).
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void* p) {
    static_cast<unsigned char*>(mydevKernelAddress(p))[5000] = 1;
    return 0;
  }, d));
  CHECK_OK(mydevMemsetAsync(d, 2, 100, nullptr));
  CHECK_OK(mydevDeviceSynchronize());
  volatile unsigned char* target = static_cast<unsigned char*>(d) + 5000;
  std::printf("device %d address %p\n", device, const_cast<unsigned char*>(target));
  std::fflush(stdout);
  unsigned char v = *target;  // must not return
  std::printf("read %d without faulting\n", v);
  return 3;
}

// A segfault that has nothing to do with device memory must look like one.
// The point of strict mode's two addresses: host code reading device memory
// while a launched function is provably running (spinning on a latch, using
// its allocation through the kernel address) is still caught. `which` is
// "same" (the running kernel's own allocation, 10000 bytes) or "other"
// (another allocation, 20000 bytes). Before kernels had their own addresses,
// device memory was open to every thread while any kernel ran, and this read
// went unnoticed.
int runStrictFaultWhileRunning(const std::string& which) {
  if (!mydevStrictMode() || launchBlocking()) return 2;
  if (which != "same" && which != "other") return 2;
  int device = deviceCount() >= 2 ? 1 : 0;
  CHECK_OK(mydevSetDevice(device));
  void* mine = nullptr;
  void* other = nullptr;
  CHECK_OK(mydevMalloc(&mine, 10000));
  CHECK_OK(mydevMalloc(&other, 20000));
  CHECK_OK(mydevMemsetAsync(other, 7, 20000, nullptr));
  struct Running {
    Latch latch;
    void* dev;
  };
  static Running running;  // the kernel never finishes; outlives main's frames
  running.dev = mine;
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void* p) {
    auto* r = static_cast<Running*>(p);
    auto* k = static_cast<unsigned char*>(mydevKernelAddress(r->dev));
    for (int i = 0; i < 10000; ++i) k[i] = static_cast<unsigned char>(i);
    return latchKernel(&r->latch);  // spins until released: never
  }, &running));
  running.latch.waitStarted();
  unsigned char* base = static_cast<unsigned char*>(which == "same" ? mine : other);
  volatile unsigned char* target = base + 5000;
  std::printf("kernel running; device %d address %p\n", device, const_cast<unsigned char*>(target));
  std::fflush(stdout);
  unsigned char v = *target;  // must not return
  std::printf("read %d without faulting\n", v);
  return 3;
}

// A launched function that dereferences a device address (forgetting
// mydevKernelAddress) faults with the same report.
int runStrictFaultInKernel() {
  if (!mydevStrictMode()) return 2;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 3000));
  std::printf("device 0 address %p\n", static_cast<void*>(static_cast<char*>(d) + 100));
  std::fflush(stdout);
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void* p) {
    static_cast<volatile unsigned char*>(p)[100] = 1;  // must not return
    return 0;
  }, d));
  mydevDeviceSynchronize();
  std::printf("kernel wrote without faulting\n");
  return 3;
}

// A freed allocation's addresses stay reserved for a while, so a use after
// free faults with a report naming it rather than a plain SIGSEGV (or, once
// the addresses are reused, silently). "device": host code reads the device
// address; "kernel": a launched function writes through the kernel address
// it kept, as a kernel outliving its arguments would.
int runStrictFaultAfterFree(const std::string& which) {
  if (!mydevStrictMode() || (which != "device" && which != "kernel")) return 2;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 6000));
  void* stale = which == "device" ? d : mydevKernelAddress(d);
  void* later = nullptr;
  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevMalloc(&later, 6000));  // takes none of the freed addresses
  CHECK(later != d && mydevKernelAddress(later) != stale);
  unsigned char* target = static_cast<unsigned char*>(stale) + 10;
  std::printf("freed %s address %p\n", which.c_str(), static_cast<void*>(target));
  std::fflush(stdout);
  if (which == "device") {
    unsigned char v = *static_cast<volatile unsigned char*>(target);  // must not return
    std::printf("read %d without faulting\n", v);
    return 3;
  }
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void* p) {
    *static_cast<volatile unsigned char*>(p) = 1;  // must not return
    return 0;
  }, target));
  mydevDeviceSynchronize();
  std::printf("kernel wrote without faulting\n");
  return 3;
}

int runStrictOtherSegv() {
  if (!mydevStrictMode()) return 2;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 100));
  size_t page = pageSize();
  void* foreign = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(foreign != MAP_FAILED);
  std::fflush(stdout);
  volatile unsigned char* target = static_cast<unsigned char*>(foreign);
  unsigned char v = *target;  // must die with SIGSEGV
  std::printf("read %d without faulting\n", v);
  return 3;
}

// Configuration as read from the environment; run in a fresh process.
int runEnv(int argc, char** argv) {
  if (argc != 5) return 2;
  const int expected_count = std::atoi(argv[2]);
  const size_t expected_limit = std::strtoull(argv[3], nullptr, 10);
  const bool expected_strict = std::atoi(argv[4]) != 0;

  CHECK(deviceCount() == expected_count);
  CHECK(!mydevIsInitialized());  // counting devices is not initialising
  size_t free_b = 0, total_b = 0;
  CHECK_OK(mydevMemGetInfo(&free_b, &total_b));
  CHECK(mydevIsInitialized());
  CHECK(total_b == expected_limit);
  CHECK(free_b == expected_limit);
  for (int d = 0; d < expected_count; ++d) {
    CHECK_OK(mydevSetDevice(d));
    mydevDeviceProp prop;
    CHECK_OK(mydevGetDeviceProperties(&prop, d));
    CHECK(prop.totalGlobalMem == expected_limit);
    CHECK_OK(mydevMemGetInfo(&free_b, &total_b));
    CHECK(total_b == expected_limit);
  }
  CHECK_ERR(mydevSetDevice(expected_count), mydevErrorInvalidDevice);
  mydevDeviceProp prop;
  CHECK_ERR(mydevGetDeviceProperties(&prop, expected_count), mydevErrorInvalidDevice);
  CHECK((mydevStrictMode() != 0) == expected_strict);
  CHECK((mydevLaunchBlocking() != 0) == launchBlocking());

  // The limit is enforced in page-rounded units: a limit below one page fits nothing.
  CHECK_OK(mydevSetDevice(0));
  void* p = nullptr;
  if (expected_limit < pageSize()) {
    CHECK_ERR(mydevMalloc(&p, 1), mydevErrorMemoryAllocation);
  } else {
    CHECK_OK(mydevMalloc(&p, 1));
    CHECK_OK(mydevFree(p));
  }
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}

// Exits (returns from main) with work queued behind a long delay, a stream
// blocked on an event that work would record, and a task in progress: exit
// must not wait for the queued work (it is dropped) nor hang.
// Registered before the runtime initialises, so it runs after the runtime's
// own exit handler stopped the workers: work then runs inline, and events and
// synchronisation still work.
void useRuntimeAfterItsExitHandler() {
  auto say = [](void* msg) {
    std::printf("%s\n", static_cast<const char*>(msg));
    return 0;
  };
  bool ok = mydevLaunchHostFunc(nullptr, say, const_cast<char*>("late work ran")) == mydevSuccess;
  mydevEvent_t ev = nullptr;
  ok = ok && mydevEventCreateWithFlags(&ev, 0) == mydevSuccess;
  ok = ok && mydevEventRecord(ev, nullptr) == mydevSuccess;
  ok = ok && mydevEventSynchronize(ev) == mydevSuccess && mydevEventQuery(ev) == mydevSuccess;
  mydevStream_t s = nullptr;
  ok = ok && mydevStreamCreateWithPriority(&s, 0) == mydevSuccess;
  ok = ok && mydevLaunchHostFunc(s, say, const_cast<char*>("late work on a new stream ran")) == mydevSuccess;
  ok = ok && mydevStreamWaitEvent(s, ev) == mydevSuccess;
  ok = ok && mydevStreamSynchronize(s) == mydevSuccess && mydevDeviceSynchronize() == mydevSuccess;
  std::printf("late use %s\n", ok ? "ok" : "FAILED");
  std::fflush(stdout);
}

int runExitPending() {
  std::atexit(useRuntimeAfterItsExitHandler);
  mydevStream_t slow = newStream(), waiter = newStream(deviceCount() - 1);
  CHECK_OK(mydevTestSetStreamDelay(slow, 60u * 1000 * 1000));
  auto say = [](void* msg) {
    std::printf("%s\n", static_cast<const char*>(msg));
    std::fflush(stdout);
    return 0;
  };
  CHECK_OK(mydevLaunchHostFunc(slow, say, const_cast<char*>("dropped work ran")));
  mydevEvent_t ev = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&ev, 0));
  CHECK_OK(mydevEventRecord(ev, slow));
  CHECK_OK(mydevStreamWaitEvent(waiter, ev));
  CHECK_OK(mydevLaunchHostFunc(waiter, say, const_cast<char*>("waiting work ran")));
  // A high-priority stream kept runnable (its worker waits out the delay)
  // holding back a low-priority stream: exit drops both without waiting.
  mydevStream_t high = newStream(deviceCount() - 1, -1), held = newStream(deviceCount() - 1, 0);
  CHECK_OK(mydevTestSetStreamDelay(high, 60u * 1000 * 1000));
  CHECK_OK(mydevLaunchHostFunc(high, say, const_cast<char*>("dropped high-priority work ran")));
  CHECK_OK(mydevLaunchHostFunc(held, say, const_cast<char*>("held-back work ran")));
  static std::atomic<int> started{0};
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void*) {
    started.store(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return 0;
  }, nullptr));
  while (!started.load()) std::this_thread::yield();
  std::printf("%d passed, 0 failed\n", g_passed);
  std::fflush(stdout);
  return 0;
}

// Exits while a launched function is stuck: exit gives up on it after a grace period.
int runExitStuck() {
  static std::atomic<int> started{0};
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void*) {
    started.store(1);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }, nullptr));
  while (!started.load()) std::this_thread::yield();
  std::printf("%d passed, 0 failed\n", g_passed);
  std::fflush(stdout);
  return 0;
}

// The launch queue limit; needs a small MYDEV_LAUNCH_QUEUE_DEPTH, without
// MYDEV_LAUNCH_BLOCKING (held kernels would hold the launching thread).
int runQueueDepth() {
  if (launchBlocking() || launchQueueDepth() == 0 || launchQueueDepth() > 64) return 2;
  testQueueDepthBlocksSubmitter();
  testQueueDepthOwnStreamDoesNotWait();
  testQueueDepthCrossStreamWaitIsBlocked();
  testQueueDepthCrossFeedDoesNotDeadlock();
  testQueueDepthDestroyReleasesSubmitter();
  testManyLaunchesBeyondQueueDepth();
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}

// Exits while a thread waits for room in a stream whose queue is full (its
// worker waits out a 60 s delay): exit drops the queue and releases that
// thread, whose work then runs inline like any work enqueued after exit.
std::atomic<bool> g_full_submitter_done{false};
mydevError_t g_full_submitter_rc = mydevErrorNotReady;

// Registered before the runtime initialises, so it runs after the runtime's
// exit handler: by then the waiting thread must have been released.
void reportFullSubmitterAtExit() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!g_full_submitter_done.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (g_full_submitter_done.load()) {
    std::printf("blocked submitter released: %s\n", mydevGetErrorName(g_full_submitter_rc));
  } else {
    std::printf("blocked submitter still waiting\n");
  }
  std::fflush(stdout);
}

int runExitFull() {
  std::atexit(reportFullSubmitterAtExit);
  const size_t depth = launchQueueDepth();
  if (depth == 0 || depth > 64) return 2;
  mydevStream_t s = newStream();
  CHECK_OK(mydevTestSetStreamDelay(s, 60u * 1000 * 1000));
  static std::atomic<bool> attempting{false};
  std::thread([s, depth] {
    auto say = [](void* msg) {
      std::printf("%s\n", static_cast<const char*>(msg));
      return 0;
    };
    for (size_t i = 0; i < depth; ++i) {
      if (mydevLaunchHostFunc(s, noopKernel, nullptr) != mydevSuccess) std::abort();
    }
    attempting.store(true);
    g_full_submitter_rc = mydevLaunchHostFunc(s, say, const_cast<char*>("blocked work ran"));
    g_full_submitter_done.store(true);
  }).detach();
  while (!attempting.load()) std::this_thread::yield();
  std::printf("%d passed, 0 failed\n", g_passed);
  std::fflush(stdout);
  return 0;
}

int runBlocking() {
  testLaunchBlocking();
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}

int runFork() {
  testQueriesDoNotInitialise();
  testForkBeforeInitIsUsable();
  testForkAfterInitIsPoisoned();
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}

// Activity tracing (mydev_activity.h): every launch, copy and inline function
// that ran while a callback was set is reported once, with its label, stream,
// correlation id and device times; nothing is reported once it is cleared.
struct ActivitySink {
  std::mutex mu;
  std::vector<mydevActivityRecord> records;
  std::vector<std::string> labels;
};
void collectActivity(const mydevActivityRecord* r, void* user) {
  auto* sink = static_cast<ActivitySink*>(user);
  std::lock_guard<std::mutex> lock(sink->mu);
  sink->records.push_back(*r);
  sink->labels.emplace_back(r->label);
}
void testActivityTracing() {
  ActivitySink sink;
  mydevStream_t s = newStream(0);
  int* d = nullptr;
  CHECK_OK(mydevMalloc(reinterpret_cast<void**>(&d), 256));
  int host[64] = {};
  CHECK_ERR(mydevActivityPopExternalCorrelationId(nullptr), mydevErrorInvalidValue);  // empty stack
  CHECK_OK(mydevActivitySetCallback(collectActivity, &sink));
  CHECK_OK(mydevActivityPushExternalCorrelationId(41));
  CHECK_OK(mydevLaunchHostFuncLabeled(s, noopKernel, nullptr, "my_op"));
  CHECK_OK(mydevActivityPushExternalCorrelationId(42));
  CHECK_OK(mydevMemcpyAsync(d, host, sizeof(host), mydevMemcpyHostToDevice, s));
  uint64_t popped = 0;
  CHECK_OK(mydevActivityPopExternalCorrelationId(&popped));
  CHECK(popped == 42);
  CHECK_OK(mydevMemsetAsync(d + 32, 0, 128, s));
  CHECK_OK(mydevMemcpyAsync(d + 32, d, 64, mydevMemcpyDeviceToDevice, s));
  CHECK_OK(mydevLaunchHostFuncInline(nullptr, noopKernel, nullptr));   // default stream, at the call
  CHECK_OK(mydevMemcpy(host, d, sizeof(host), mydevMemcpyDeviceToHost));
  CHECK_OK(mydevActivityPopExternalCorrelationId(&popped));
  CHECK(popped == 41);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_OK(mydevActivitySetCallback(nullptr, nullptr));
  CHECK_OK(mydevLaunchHostFuncLabeled(s, noopKernel, nullptr, "untraced"));
  CHECK_OK(mydevStreamSynchronize(s));
  std::lock_guard<std::mutex> lock(sink.mu);
  CHECK(sink.records.size() == 6);
  // Work on different streams is reported as it finishes: find each by what it was.
  auto find = [&](mydevActivityKind kind, const char* label, int inline_launch) -> const mydevActivityRecord& {
    for (size_t n = 0; n < sink.records.size(); ++n) {
      if (sink.records[n].kind == kind && sink.labels[n] == label && sink.records[n].inline_launch == inline_launch) {
        return sink.records[n];
      }
    }
    std::fprintf(stderr, "no activity record %s\n", label);
    std::abort();
  };
  // Under MYDEV_LAUNCH_BLOCKING a launch or copy runs in the caller, in stream order: inline.
  const mydevActivityRecord& k = find(mydevActivityKindKernel, "my_op", launchBlocking() ? 1 : 0);
  CHECK(k.stream == s && k.device == 0 && k.correlation_id == 41);
  CHECK(k.start_ns > 0 && k.end_ns >= k.start_ns);
  const mydevActivityRecord& c = find(mydevActivityKindMemcpy, "HtoD", launchBlocking() ? 1 : 0);
  CHECK(c.bytes == sizeof(host) && c.correlation_id == 42 && c.stream == s);
  CHECK(c.start_ns >= k.end_ns);  // stream order
  const mydevActivityRecord& m = find(mydevActivityKindMemset, "", launchBlocking() ? 1 : 0);
  CHECK(m.bytes == 128 && m.correlation_id == 41 && m.stream == s && m.start_ns >= c.end_ns);
  const mydevActivityRecord& dd = find(mydevActivityKindMemcpy, "DtoD", launchBlocking() ? 1 : 0);
  CHECK(dd.bytes == 64 && dd.correlation_id == 41 && dd.stream == s && dd.start_ns >= m.end_ns);
  const mydevActivityRecord& i = find(mydevActivityKindKernel, "", 1);
  CHECK(i.stream == nullptr && i.correlation_id == 41);
  const mydevActivityRecord& h = find(mydevActivityKindMemcpy, "DtoH", 1);
  CHECK(h.bytes == sizeof(host) && h.correlation_id == 41);
  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevStreamDestroy(s));
}

int runAll() {
  // These two need a process in which nothing has initialised the runtime.
  testQueriesDoNotInitialise();
  testForkBeforeInitIsUsable();

  // The suite allocates a few hundred KiB per device; the env mode covers
  // tiny limits.
  if (limitBytes() < (size_t(1) << 20)) {
    std::fprintf(stderr, "runtime_test: needs MYDEV_MEMORY_LIMIT of at least 1M\n");
    return 2;
  }

  testErrorText();
  testDevices();
  testCurrentDeviceIsPerThread();
  testMallocAccounting();
  testOutOfMemory();
  testPinnedMemory();
  testPointerAttributes();
  testCopiesRoundTrip();
  testKernelAddresses();
  testCopyValidation();
  testStreams();
  testDefaultStreamHandles();
  testLaunch();
  testEvents();
  testLaunchIsAsynchronous();
  testFifoOrder();
  testEventsOrderStreams();
  testEventTimingAroundDelayedWork();
  testStickyErrorAndLabel();
  testLaunchInline();
  testShortTasks();
  testCallerTasks();
  testWaitingHostRunsQueuedWork();
  testActivityTracing();
  testPriorityOrder();
  testPriorityNoDeadlock();
  if (launchBlocking()) testLaunchBlocking();
  testCopiesOrderedWithLaunches();
  testNestedRuntimeCalls();
  testDestroyWhileEnqueuing();
  testManyThreads();
  testStress();
  testManyLaunchesBeyondQueueDepth();
  testForkAfterInitIsPoisoned();
  for (int d = 0; d < deviceCount(); ++d) CHECK(freeBytes(d) == limitBytes());
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "all";
  if (mode == "all") return runAll();
  if (mode == "env") return runEnv(argc, argv);
  if (mode == "strict") return runStrict();
  if (mode == "strict-fault") return runStrictFault();
  if (mode == "strict-other-segv") return runStrictOtherSegv();
  if (mode == "strict-fault-running") return runStrictFaultWhileRunning(argc > 2 ? argv[2] : "");
  if (mode == "strict-fault-kernel") return runStrictFaultInKernel();
  if (mode == "strict-fault-freed") return runStrictFaultAfterFree(argc > 2 ? argv[2] : "");
  if (mode == "fork") return runFork();
  if (mode == "exit-pending") return runExitPending();
  if (mode == "exit-stuck") return runExitStuck();
  if (mode == "blocking") return runBlocking();
  if (mode == "queue-depth") return runQueueDepth();
  if (mode == "exit-full") return runExitFull();
  std::fprintf(stderr, "unknown mode: %s\n", mode.c_str());
  return 2;
}
