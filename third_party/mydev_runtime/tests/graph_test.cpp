// Tests of stream capture and graphs (mydev_runtime.h, "graphs"). Built and
// run by test/test_runtime.py like runtime_test.cpp, as a binary of its own.
#include "mydev_runtime.h"
#include "mydev_emulator.h"
#include "check.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace {

mydevStream_t newStream() {
  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, 0));
  return s;
}

// A device int the kernels below add to, through its kernel address.
struct Counter {
  int* dev = nullptr;
  Counter() {
    CHECK_OK(mydevMalloc(reinterpret_cast<void**>(&dev), sizeof(int)));
    int zero = 0;
    CHECK_OK(mydevMemcpy(dev, &zero, sizeof(int), mydevMemcpyHostToDevice));
  }
  ~Counter() { mydevFree(dev); }
  int read() {
    int v = -1;
    CHECK_OK(mydevMemcpy(&v, dev, sizeof(int), mydevMemcpyDeviceToHost));
    return v;
  }
};

int addOne(void* p) {
  ++*static_cast<int*>(mydevKernelAddress(p));
  return 0;
}
// Multiplies by ten: with addOne, the result tells the order the nodes ran in.
int timesTen(void* p) {
  *static_cast<int*>(mydevKernelAddress(p)) *= 10;
  return 0;
}
int failing(void*) { return 1; }

mydevGraph_t endCapture(mydevStream_t s, mydevError_t expected = mydevSuccess) {
  mydevGraph_t g = nullptr;
  CHECK_ERR(mydevStreamEndCapture(s, &g), expected);
  CHECK((g != nullptr) == (expected == mydevSuccess));
  return g;
}

void testCaptureRunsNothingAndReplays() {
  Counter c;
  mydevStream_t s = newStream();
  CHECK_OK(mydevStreamBeginCapture(s, mydevStreamCaptureModeGlobal));
  mydevStreamCaptureStatus status;
  unsigned long long id = 0;
  CHECK_OK(mydevStreamGetCaptureInfo(s, &status, &id));
  CHECK(status == mydevStreamCaptureStatusActive && id != 0);
  CHECK_OK(mydevLaunchHostFuncLabeled(s, addOne, c.dev, "add"));
  CHECK_OK(mydevLaunchHostFuncEx(s, timesTen, c.dev, "times", mydevLaunchShortTask));
  CHECK_ERR(mydevLaunchHostFuncEx(s, addOne, c.dev, "idle", mydevLaunchShortTask | mydevLaunchIdleOnly),
            mydevErrorNotReady);
  mydevCallerTask task;
  CHECK_ERR(mydevStreamBeginCallerTask(s, &task), mydevErrorNotReady);
  CHECK_OK(mydevLaunchHostFuncLabeled(s, addOne, c.dev, "add"));
  CHECK_ERR(mydevStreamBeginCapture(s, mydevStreamCaptureModeGlobal), mydevErrorIllegalState);
  CHECK_OK(mydevStreamQuery(s));  // nothing queued: captured work does not run
  mydevGraph_t g = endCapture(s);
  CHECK_OK(mydevStreamGetCaptureInfo(s, &status, &id));
  CHECK(status == mydevStreamCaptureStatusNone && id == 0);
  CHECK(c.read() == 0);
  size_t nodes = 0;
  CHECK_OK(mydevGraphGetNodeCount(g, &nodes));
  CHECK(nodes == 3);
  mydevGraphExec_t x = nullptr;
  CHECK_OK(mydevGraphInstantiate(&x, g));
  CHECK_OK(mydevGraphDestroy(g));  // the executable keeps what it needs
  CHECK_OK(mydevGraphLaunch(x, s));
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(c.read() == 11);  // (0 + 1) * 10 + 1: in capture order
  CHECK_OK(mydevGraphLaunch(x, nullptr));  // the default stream replays it too
  CHECK_OK(mydevDeviceSynchronize());
  CHECK(c.read() == 121);
  CHECK_OK(mydevGraphExecDestroy(x));
  CHECK_ERR(mydevGraphLaunch(x, s), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevGraphDestroy(g), mydevErrorInvalidResourceHandle);
  CHECK_OK(mydevStreamDestroy(s));
}

void testCopiesAndMemsets() {
  mydevStream_t s = newStream();
  unsigned char *a = nullptr, *b = nullptr;
  CHECK_OK(mydevMalloc(reinterpret_cast<void**>(&a), 64));
  CHECK_OK(mydevMalloc(reinterpret_cast<void**>(&b), 64));
  unsigned char host[64] = {};
  CHECK_OK(mydevMemcpy(a, host, sizeof(host), mydevMemcpyHostToDevice));
  CHECK_OK(mydevStreamBeginCapture(s, mydevStreamCaptureModeGlobal));
  CHECK_OK(mydevMemsetAsync(a, 7, 64, s));
  CHECK_OK(mydevMemcpyAsync(b, a, 32, mydevMemcpyDeviceToDevice, s));
  mydevGraph_t g = endCapture(s);
  CHECK_OK(mydevMemcpy(b, host, sizeof(host), mydevMemcpyHostToDevice));
  CHECK_OK(mydevMemcpy(host, a, 1, mydevMemcpyDeviceToHost));
  CHECK(host[0] == 0);  // the capture wrote nothing
  mydevGraphExec_t x;
  CHECK_OK(mydevGraphInstantiate(&x, g));
  CHECK_OK(mydevGraphLaunch(x, s));
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK_OK(mydevMemcpy(host, b, 64, mydevMemcpyDeviceToHost));
  CHECK(host[0] == 7 && host[31] == 7);
  CHECK_OK(mydevGraphExecDestroy(x));
  CHECK_OK(mydevGraphDestroy(g));
  mydevFree(a);
  mydevFree(b);
  CHECK_OK(mydevStreamDestroy(s));
}

void testWaitsRefusedDuringCapture() {
  Counter c;
  mydevStream_t s = newStream();
  mydevGraph_t g;
  // Each refused wait invalidates the capture; the stream works afterwards.
  auto refused = [&](auto&& wait, mydevError_t expected, mydevStreamCaptureMode mode) {
    CHECK_OK(mydevStreamBeginCapture(s, mode));
    CHECK_OK(mydevLaunchHostFunc(s, addOne, c.dev));
    CHECK_ERR(wait(), expected);
    mydevStreamCaptureStatus status;
    CHECK_OK(mydevStreamGetCaptureInfo(s, &status, nullptr));
    CHECK(status == mydevStreamCaptureStatusInvalidated);
    CHECK_ERR(mydevLaunchHostFunc(s, addOne, c.dev), mydevErrorStreamCaptureInvalidated);
    endCapture(s, mydevErrorStreamCaptureInvalidated);
  };
  refused([&] { return mydevStreamSynchronize(s); }, mydevErrorStreamCaptureUnsupported, mydevStreamCaptureModeGlobal);
  refused([&] { return mydevLaunchHostFuncInline(s, addOne, c.dev); }, mydevErrorStreamCaptureUnsupported,
          mydevStreamCaptureModeRelaxed);
  refused([&] { return mydevDeviceSynchronize(); }, mydevErrorStreamCaptureUnsupported, mydevStreamCaptureModeGlobal);
  refused([&] { return mydevDeviceWaitIdle(); }, mydevErrorStreamCaptureUnsupported, mydevStreamCaptureModeThreadLocal);
  refused([&] {
    int v;
    return mydevMemcpy(&v, c.dev, sizeof(int), mydevMemcpyDeviceToHost);
  }, mydevErrorStreamCaptureUnsupported, mydevStreamCaptureModeGlobal);
  mydevEvent_t e;
  CHECK_OK(mydevEventCreateWithFlags(&e, 0));
  refused([&] {
    CHECK_OK(mydevEventRecord(e, s));
    return mydevEventSynchronize(e);
  }, mydevErrorCapturedEvent, mydevStreamCaptureModeGlobal);
  refused([&] {
    CHECK_OK(mydevEventRecord(e, s));
    return mydevEventQuery(e);
  }, mydevErrorCapturedEvent, mydevStreamCaptureModeGlobal);
  // Waiting for unfinished work outside the capture.
  mydevStream_t busy = newStream();
  CHECK_OK(mydevTestSetStreamDelay(busy, 200000));
  mydevEvent_t outside;
  CHECK_OK(mydevEventCreateWithFlags(&outside, 0));
  CHECK_OK(mydevLaunchHostFunc(busy, addOne, c.dev));
  CHECK_OK(mydevEventRecord(outside, busy));
  if (!mydevLaunchBlocking()) {  // (where every launch has run when it returns, nothing is unfinished)
    refused([&] { return mydevStreamWaitEvent(s, outside); }, mydevErrorStreamCaptureIsolation,
            mydevStreamCaptureModeGlobal);
  }
  CHECK_OK(mydevTestSetStreamDelay(busy, 0));
  CHECK_OK(mydevStreamSynchronize(busy));
  // A completed outside event orders nothing: allowed.
  CHECK_OK(mydevStreamBeginCapture(s, mydevStreamCaptureModeGlobal));
  CHECK_OK(mydevStreamWaitEvent(s, outside));
  g = endCapture(s);
  CHECK_OK(mydevGraphDestroy(g));

  // Relaxed: device-wide waits are the caller's business.
  CHECK_OK(mydevStreamBeginCapture(s, mydevStreamCaptureModeRelaxed));
  CHECK_OK(mydevLaunchHostFunc(s, addOne, c.dev));
  CHECK_OK(mydevDeviceSynchronize());
  g = endCapture(s);
  CHECK_OK(mydevGraphDestroy(g));
  // Thread-local: another thread's device-wide wait is allowed.
  CHECK_OK(mydevStreamBeginCapture(s, mydevStreamCaptureModeThreadLocal));
  mydevError_t other = mydevErrorInvalidValue;
  std::thread([&] { other = mydevDeviceSynchronize(); }).join();
  CHECK_OK(other);
  g = endCapture(s);
  CHECK_OK(mydevGraphDestroy(g));

  // The stream (and the device) still work, and nothing captured ran.
  CHECK(c.read() == 1);  // the busy stream's launch
  CHECK_OK(mydevLaunchHostFunc(s, addOne, c.dev));
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(c.read() == 2);

  // Misuse.
  mydevStream_t def = nullptr;
  CHECK_OK(mydevDeviceGetDefaultStream(0, &def));
  CHECK_ERR(mydevStreamBeginCapture(def, mydevStreamCaptureModeGlobal), mydevErrorStreamCaptureUnsupported);
  CHECK_ERR(mydevStreamBeginCapture(nullptr, mydevStreamCaptureModeGlobal), mydevErrorStreamCaptureUnsupported);
  endCapture(s, mydevErrorIllegalState);
  CHECK_OK(mydevEventDestroy(e));
  CHECK_OK(mydevEventDestroy(outside));
  CHECK_OK(mydevStreamDestroy(busy));
  CHECK_OK(mydevStreamDestroy(s));
}

void testMultiStreamCapture() {
  Counter c;
  mydevStream_t s = newStream(), side = newStream();
  mydevEvent_t fork, join;
  CHECK_OK(mydevEventCreateWithFlags(&fork, mydevEventDisableTiming));
  CHECK_OK(mydevEventCreateWithFlags(&join, mydevEventDisableTiming));
  CHECK_OK(mydevStreamBeginCapture(s, mydevStreamCaptureModeGlobal));
  CHECK_OK(mydevLaunchHostFunc(s, addOne, c.dev));  // node 0
  CHECK_OK(mydevEventRecord(fork, s));
  CHECK_OK(mydevStreamWaitEvent(side, fork));       // side joins the capture after node 0
  unsigned long long s_id = 0, side_id = 0;
  mydevStreamCaptureStatus status;
  CHECK_OK(mydevStreamGetCaptureInfo(s, &status, &s_id));
  CHECK_OK(mydevStreamGetCaptureInfo(side, &status, &side_id));
  CHECK(status == mydevStreamCaptureStatusActive && side_id == s_id);
  CHECK_OK(mydevLaunchHostFuncLabeled(side, timesTen, c.dev, "side"));  // node 1, after node 0
  CHECK_OK(mydevEventRecord(join, side));
  CHECK_ERR(mydevStreamEndCapture(side, nullptr), mydevErrorInvalidValue);
  mydevGraph_t none = nullptr;
  CHECK_ERR(mydevStreamEndCapture(side, &none), mydevErrorStreamCaptureUnmatched);
  CHECK_OK(mydevStreamWaitEvent(s, join));          // joined back
  CHECK_OK(mydevLaunchHostFunc(s, addOne, c.dev));  // node 2, after nodes 0 and 1
  mydevGraph_t g = endCapture(s);
  CHECK_OK(mydevStreamGetCaptureInfo(side, &status, nullptr));
  CHECK(status == mydevStreamCaptureStatusNone);
  std::string path = "/tmp/mydev_graph_test_" + std::to_string(getpid()) + ".dot";
  CHECK_OK(mydevGraphDebugDotPrint(g, path.c_str()));
  std::stringstream dot;
  dot << std::ifstream(path).rdbuf();
  unlink(path.c_str());
  CHECK(dot.str().find("digraph") != std::string::npos);
  CHECK(dot.str().find("n0 -> n1;") != std::string::npos);
  CHECK(dot.str().find("n1 -> n2;") != std::string::npos);
  CHECK(dot.str().find("side") != std::string::npos);
  mydevGraphExec_t x;
  CHECK_OK(mydevGraphInstantiate(&x, g));
  CHECK_OK(mydevGraphLaunch(x, s));
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(c.read() == 11);
  CHECK_OK(mydevGraphExecDestroy(x));
  CHECK_OK(mydevGraphDestroy(g));

  // A fork never joined back.
  CHECK_OK(mydevStreamBeginCapture(s, mydevStreamCaptureModeGlobal));
  CHECK_OK(mydevEventRecord(fork, s));
  CHECK_OK(mydevStreamWaitEvent(side, fork));
  CHECK_OK(mydevLaunchHostFunc(side, addOne, c.dev));
  endCapture(s, mydevErrorStreamCaptureUnjoined);
  CHECK_OK(mydevStreamGetCaptureInfo(side, &status, nullptr));
  CHECK(status == mydevStreamCaptureStatusNone);
  CHECK_OK(mydevStreamSynchronize(side));  // not capturing any more
  CHECK(c.read() == 11);
  CHECK_OK(mydevEventDestroy(fork));
  CHECK_OK(mydevEventDestroy(join));
  CHECK_OK(mydevStreamDestroy(side));
  CHECK_OK(mydevStreamDestroy(s));
}

std::atomic<int> g_destroyed{0};
void destroyObject(void* p) {
  ++g_destroyed;
  delete static_cast<int*>(p);
}

void testRetainedObjectsAndFailures() {
  Counter c;
  mydevStream_t s = newStream();
  CHECK_ERR(mydevStreamCaptureRetainObject(s, new int(0), destroyObject), mydevErrorIllegalState);  // (leaks one int)
  CHECK_OK(mydevStreamBeginCapture(s, mydevStreamCaptureModeGlobal));
  CHECK_OK(mydevStreamCaptureRetainObject(s, new int(1), destroyObject));
  CHECK_OK(mydevLaunchHostFuncLabeled(s, addOne, c.dev, "first"));
  CHECK_OK(mydevLaunchHostFuncLabeled(s, failing, nullptr, "broken op"));
  CHECK_OK(mydevLaunchHostFuncLabeled(s, addOne, c.dev, "third"));
  CHECK_OK(mydevStreamCaptureRetainObject(s, new int(2), destroyObject));
  mydevGraph_t g = endCapture(s);
  mydevGraphExec_t x;
  CHECK_OK(mydevGraphInstantiate(&x, g));
  CHECK_OK(mydevGraphLaunch(x, s));
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);
  char label[64];
  CHECK_OK(mydevStreamGetErrorLabel(s, label, sizeof(label)));
  CHECK(std::strcmp(label, "broken op") == 0);
  CHECK(c.read() == 2);  // the nodes after the failing one ran
  CHECK_OK(mydevStreamSynchronize(s));  // reported once
  CHECK_OK(mydevGraphDestroy(g));
  CHECK(g_destroyed == 0);  // the executable holds them
  CHECK_OK(mydevGraphExecDestroy(x));
  CHECK(g_destroyed == 2);
  // A failed capture destroys what it was given.
  CHECK_OK(mydevStreamBeginCapture(s, mydevStreamCaptureModeGlobal));
  CHECK_OK(mydevStreamCaptureRetainObject(s, new int(3), destroyObject));
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorStreamCaptureUnsupported);
  endCapture(s, mydevErrorStreamCaptureInvalidated);
  CHECK(g_destroyed == 3);
  CHECK_OK(mydevStreamDestroy(s));
}

}  // namespace

// Two kernels that each wait until the other has started: they finish only if
// the replay runs them at the same time (or give up after a second).
std::atomic<int> g_started{0};
std::atomic<int> g_met{0};
int meetTheOther(void* p) {
  g_started.fetch_add(1);
  for (int i = 0; i < 1000 && g_started.load() < 2; ++i) usleep(1000);
  if (g_started.load() >= 2) g_met.fetch_add(1);
  return addOne(p);
}

void testDeclaredMemoryRunsIndependentNodesTogether() {
  Counter a, b, shared;
  mydevStream_t s = newStream();
  const mydevMemRange in_a{a.dev, sizeof(int), 1}, in_b{b.dev, sizeof(int), 1};
  // Both first nodes also read `shared`: reads alone order nothing.
  const mydevMemRange a_reading[2] = {in_a, {shared.dev, sizeof(int), 0}};
  const mydevMemRange b_reading[2] = {in_b, {shared.dev, sizeof(int), 0}};
  CHECK_ERR(mydevStreamCaptureDeclareMemory(s, &in_a, 1), mydevErrorIllegalState);  // not capturing
  CHECK_OK(mydevStreamBeginCapture(s, mydevStreamCaptureModeGlobal));
  CHECK_ERR(mydevStreamCaptureDeclareMemory(s, &in_a, 1), mydevErrorIllegalState);  // nothing captured yet
  CHECK_OK(mydevLaunchHostFuncLabeled(s, meetTheOther, a.dev, "a"));
  CHECK_OK(mydevStreamCaptureDeclareMemory(s, a_reading, 2));
  CHECK_OK(mydevLaunchHostFuncLabeled(s, meetTheOther, b.dev, "b"));
  CHECK_OK(mydevStreamCaptureDeclareMemory(s, b_reading, 2));
  // Same memory as "a": after it, whatever ran meanwhile.
  CHECK_OK(mydevLaunchHostFuncLabeled(s, timesTen, a.dev, "a again"));
  CHECK_OK(mydevStreamCaptureDeclareMemory(s, &in_a, 1));
  // Undeclared: after everything before it.
  CHECK_OK(mydevLaunchHostFuncLabeled(s, timesTen, b.dev, "b undeclared"));
  CHECK_OK(mydevLaunchHostFuncLabeled(s, addOne, b.dev, "b last"));
  CHECK_OK(mydevStreamCaptureDeclareMemory(s, &in_b, 1));
  mydevGraph_t g = endCapture(s);
  mydevGraphExec_t x = nullptr;
  CHECK_OK(mydevGraphInstantiate(&x, g));
  for (int replay = 1; replay <= 3; ++replay) {
    g_started = 0;
    g_met = 0;
    CHECK_OK(mydevGraphLaunch(x, s));
    CHECK_OK(mydevStreamSynchronize(s));
    const char* threads = std::getenv("MYDEV_COMPUTE_UNITS");
    // One after the other, only the second finds the first started.
    CHECK(g_met.load() == ((threads != nullptr && std::atoi(threads) == 1) ? 1 : 2));
  }
  CHECK(a.read() == 1110);  // a = (a + 1) * 10 per replay: "a again" after "a"
  CHECK(b.read() == 1221);  // b = (b + 1) * 10 + 1: the undeclared node between the two
  CHECK_OK(mydevGraphExecDestroy(x));
  CHECK_OK(mydevGraphDestroy(g));
  CHECK_OK(mydevStreamDestroy(s));
}

// Runs meetTheOther's wait on every compute unit mydevRunOnComputeUnits gives: each call counts the others.
std::atomic<int> g_units{0};
void meetOnAUnit(void*) {
  g_units.fetch_add(1);
  g_started.fetch_add(1);
  for (int i = 0; i < 1000 && g_started.load() < 2; ++i) usleep(1000);
  if (g_started.load() >= 2) g_met.fetch_add(1);
}

int shareTheUnits(void*) {
  return mydevRunOnComputeUnits(meetOnAUnit, nullptr) == mydevSuccess ? 0 : 1;
}

void testLaunchedFunctionsShareComputeUnits() {
  const char* units = std::getenv("MYDEV_COMPUTE_UNITS");
  const bool one = units != nullptr && std::atoi(units) == 1;
  CHECK_ERR(mydevRunOnComputeUnits(nullptr, nullptr), mydevErrorInvalidValue);
  int count = 0, asked = -1;
  CHECK_ERR(mydevGetComputeUnits(nullptr, &asked), mydevErrorInvalidValue);
  CHECK_OK(mydevGetComputeUnits(&count, &asked));
  CHECK(count == (units == nullptr || *units == '\0' ? 2 : std::atoi(units)));
  CHECK(asked == (units != nullptr && *units != '\0' ? 1 : 0));
  // Outside a launched function: once, on the calling thread.
  g_units = 0;
  g_started = 1;  // so that the call does not wait for a second one
  CHECK_OK(mydevRunOnComputeUnits(meetOnAUnit, nullptr));
  CHECK(g_units.load() == 1);
  // Inside one: on the worker and, at the same time, on the other unit.
  mydevStream_t s = newStream();
  for (int round = 0; round < 3; ++round) {
    g_units = 0;
    g_started = 0;
    g_met = 0;
    CHECK_OK(mydevLaunchHostFuncLabeled(s, shareTheUnits, nullptr, "share"));
    CHECK_OK(mydevStreamSynchronize(s));
    CHECK(g_units.load() == (one ? 1 : 2));
    CHECK(g_met.load() == (one ? 0 : 2));
  }
  CHECK_OK(mydevStreamDestroy(s));
}

int main() {
  // Two replay threads always, unless the run asks for serial replays: the
  // nodes below are too short for the runtime to choose them by itself.
  setenv("MYDEV_COMPUTE_UNITS", "2", /*overwrite=*/0);
  testCaptureRunsNothingAndReplays();
  testCopiesAndMemsets();
  testWaitsRefusedDuringCapture();
  testMultiStreamCapture();
  testRetainedObjectsAndFailures();
  testDeclaredMemoryRunsIndependentNodesTogether();
  testLaunchedFunctionsShareComputeUnits();
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}
