// Runtime tests: the launch queue's depth limit.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

// ---- launch queue depth ----------------------------------------------------

// MYDEV_LAUNCH_QUEUE_DEPTH as the runtime reads it (0: no limit).
size_t launchQueueDepth() {
  const char* v = std::getenv("MYDEV_LAUNCH_QUEUE_DEPTH");
  return v && *v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : 1024;
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

}  // namespace rt
