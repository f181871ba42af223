// Runtime tests: before initialisation, errors and devices.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

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

}  // namespace rt
