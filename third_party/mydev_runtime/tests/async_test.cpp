// Runtime tests: asynchronous execution: order, sticky errors, short, caller and inline tasks, waiting hosts.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

// ---- asynchronous execution ------------------------------------------------

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

// The test delay holds back each task: one drained by a synchronising host
// while the worker waited out its delay does not count as served for the
// next task, which may come after the wait ended.
void testDelayHoldsBackEachTask() {
  if (launchBlocking()) return;  // (every launch waits out the delay at the call)
  mydevStream_t s = newStream();
  std::atomic<int> flag{0};
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  std::this_thread::sleep_for(std::chrono::microseconds(kDelayUs / 3));  // the worker is waiting out the first's
  CHECK_OK(mydevTestSetStreamDelay(s, 0));
  CHECK_OK(mydevStreamSynchronize(s));  // drains both meanwhile
  CHECK(flag.load() == 2);
  std::this_thread::sleep_for(std::chrono::microseconds(2 * kDelayUs));  // its wait has ended
  CHECK_OK(mydevTestSetStreamDelay(s, 4 * kDelayUs));
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  std::this_thread::sleep_for(std::chrono::microseconds(kDelayUs));
  CHECK(flag.load() == 2);
  CHECK_ERR(mydevStreamQuery(s), mydevErrorNotReady);
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(flag.load() == 3);
  CHECK_OK(mydevTestSetStreamDelay(s, 0));
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

// An idle worker spins a while before it sleeps, so that a host launching
// every few microseconds does not pay a wake-up each time. Short kernels a host
// runs at the call on the idle stream meanwhile give the worker nothing to do:
// its spin goes on, and the next queued launch finds it awake. (They used to
// end the spin, and the worker slept through every such gap.)
void testShortTasksAtTheCallKeepTheWorkerSpinning() {
  if (launchBlocking()) return;
  mydevStream_t s = newStream();
  std::atomic<int> flag{0};
  bool awake_every_time = false;
  // Each try must fit in the worker's spin; a try the machine descheduled
  // for that long may wake it, so one clean try of five is enough.
  for (int attempt = 0; attempt < 5 && !awake_every_time; ++attempt) {
    CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
    CHECK_OK(mydevStreamSynchronize(s));
    unsigned long long before = 0, after = 0;
    CHECK_OK(mydevTestGetStreamWorkerWakes(s, &before));
    for (int i = 0; i < 4; ++i) {
      // (The pauses, well inside the spin, let the worker start spinning, and
      // then notice the short task if it would.)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      ShortProbe here;
      CHECK_OK(mydevLaunchHostFuncEx(s, shortProbeKernel, &here, "short", mydevLaunchShortTask));
      CHECK(here.thread == std::this_thread::get_id());
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
      CHECK_OK(mydevStreamSynchronize(s));
    }
    CHECK_OK(mydevTestGetStreamWorkerWakes(s, &after));
    awake_every_time = after == before;
  }
  CHECK(awake_every_time);
  CHECK_ERR(mydevTestGetStreamWorkerWakes(s, nullptr), mydevErrorInvalidValue);
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

}  // namespace rt
