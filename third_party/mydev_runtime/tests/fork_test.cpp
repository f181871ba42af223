// Runtime tests: fork after initialisation.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

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

}  // namespace rt
