// Standalone tests for the mydev runtime. No framework: CHECK stops at the
// first failure with file:line and the expression. The tests live one concept
// per file (tests/<concept>_test.cpp, declared in runtime_tests.h); this file
// runs them, in the modes below.
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
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {
namespace {

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
  testDelayHoldsBackEachTask();
  testShortTasksAtTheCallKeepTheWorkerSpinning();
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
  testTeams();
  testManyThreads();
  testStress();
  testManyLaunchesBeyondQueueDepth();
  testForkAfterInitIsPoisoned();
  for (int d = 0; d < deviceCount(); ++d) CHECK(freeBytes(d) == limitBytes());
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}

}  // namespace
}  // namespace rt

int main(int argc, char** argv) {
  using namespace rt;
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
