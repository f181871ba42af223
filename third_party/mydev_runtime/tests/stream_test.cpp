// Runtime tests: streams and launches.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

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

}  // namespace rt
