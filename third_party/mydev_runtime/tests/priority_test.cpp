// Runtime tests: stream priorities.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

// ---- priorities ---------------------------------------------------------------
// Deterministic: streams are held by kernels that wait for a host latch, never
// by sleeps, and the order in which tasks ran is recorded.

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

}  // namespace rt
