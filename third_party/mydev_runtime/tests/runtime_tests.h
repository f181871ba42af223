// The runtime tests' entry points and what the test files share, one file per concept:
// each <concept>_test.cpp defines its tests; runtime_test.cpp runs them.
#ifndef MYDEV_RUNTIME_TESTS_RUNTIME_TESTS_H
#define MYDEV_RUNTIME_TESTS_RUNTIME_TESTS_H

#include "helpers.h"

namespace rt {

// device_test.cpp
void testQueriesDoNotInitialise();
void testForkBeforeInitIsUsable();
void testErrorText();
void testDevices();
void testCurrentDeviceIsPerThread();
// memory_test.cpp
void testMallocAccounting();
void testOutOfMemory();
void testPinnedMemory();
void testPointerAttributes();
// copy_test.cpp
void testCopiesRoundTrip();
void testKernelAddresses();
void testCopyValidation();
// stream_test.cpp
void testStreams();
void testDefaultStreamHandles();
int writeKernel(void* ud);
int failingKernel(void* ud);
void testLaunch();
// event_test.cpp
void testEvents();
// async_test.cpp
void testLaunchIsAsynchronous();
int fifoKernel(void* ud);
void testFifoOrder();
void testDelayHoldsBackEachTask();
void testShortTasksAtTheCallKeepTheWorkerSpinning();
void testEventsOrderStreams();
void testEventTimingAroundDelayedWork();
void testStickyErrorAndLabel();
int inlineProbeKernel(void* p);
int shortProbeKernel(void* ud);
void testShortTasks();
int drainProbeKernel(void* ud);
int heldKernel(void* ud);
void testWaitingHostRunsQueuedWork();
void testCallerTasks();
void testLaunchInline();
// priority_test.cpp
int latchKernel(void* ud);
void syncWithin(mydevStream_t s, int seconds, const char* what);
void testPriorityOrder();
void testPriorityNoDeadlock();
// ordering_test.cpp
void testLaunchBlocking();
void testCopiesOrderedWithLaunches();
int nestedInner(void* p);
int nestedOuter(void* p);
void testNestedRuntimeCalls();
void testDestroyWhileEnqueuing();
int stressKernel(void* p);
void testStress();
void testManyThreads();
// queue_depth_test.cpp
size_t launchQueueDepth();
void testQueueDepthBlocksSubmitter();
void testQueueDepthOwnStreamDoesNotWait();
void testQueueDepthCrossStreamWaitIsBlocked();
void testQueueDepthCrossFeedDoesNotDeadlock();
void testQueueDepthDestroyReleasesSubmitter();
void testManyLaunchesBeyondQueueDepth();
// fork_test.cpp
void testForkAfterInitIsPoisoned();
// team_test.cpp
void testTeams();
// strict_test.cpp
int strictKernel(void* ud);
int runStrict();
int runStrictFault();
int runStrictFaultWhileRunning(const std::string& which);
int runStrictFaultInKernel();
int runStrictFaultAfterFree(const std::string& which);
int runStrictOtherSegv();
// exit_test.cpp
void useRuntimeAfterItsExitHandler();
int runExitPending();
int runExitStuck();
int runQueueDepth();
void reportFullSubmitterAtExit();
int runExitFull();
int runBlocking();
int runFork();
// activity_test.cpp
void collectActivity(const mydevActivityRecord* r, void* user);
void testActivityTracing();

}  // namespace rt

#endif  // MYDEV_RUNTIME_TESTS_RUNTIME_TESTS_H
