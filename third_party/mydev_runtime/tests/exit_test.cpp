// Runtime tests: process exit with queued, stuck or waiting work.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

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

}  // namespace rt
