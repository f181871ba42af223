// Runtime tests: launch blocking, copies and nested calls in stream order, destroy while enqueuing, stress, many threads.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

// Only in blocking mode (MYDEV_LAUNCH_BLOCKING=1).
void testLaunchBlocking() {
  CHECK(launchBlocking());
  CHECK(mydevLaunchBlocking() != 0);
  mydevStream_t s = newStream();
  CHECK_OK(mydevTestSetStreamDelay(s, kDelayUs));
  std::atomic<int> flag{0};
  auto t0 = std::chrono::steady_clock::now();
  CHECK_OK(mydevLaunchHostFunc(s, setFlagKernel, &flag));
  CHECK(flag.load() == 1);  // complete when the launch returned, despite the delay
  CHECK(msSince(t0) >= kDelayUs / 1000.0);
  CHECK_OK(mydevStreamQuery(s));
  std::atomic<int> failures{0};
  CHECK_ERR(mydevLaunchHostFuncLabeled(s, failingKernel, &failures, "blocking failure"),
            mydevErrorLaunchFailure);
  CHECK(failures == 1);
  CHECK(errorLabel(s) == "blocking failure");  // available before any synchronisation
  CHECK_ERR(mydevStreamSynchronize(s), mydevErrorLaunchFailure);  // still sticky too
  CHECK_OK(mydevStreamSynchronize(s));

  // Copies, memsets and records are complete on return too.
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 64));
  CHECK_OK(mydevMemsetAsync(d, 0x5c, 64, s));
  unsigned char out[64] = {};
  CHECK_OK(mydevMemcpyAsync(out, d, 64, mydevMemcpyDeviceToHost, s));
  for (unsigned char c : out) CHECK(c == 0x5c);
  mydevEvent_t ev = nullptr;
  CHECK_OK(mydevEventCreateWithFlags(&ev, 0));
  CHECK_OK(mydevEventRecord(ev, s));
  CHECK_OK(mydevEventQuery(ev));
  CHECK_OK(mydevEventDestroy(ev));
  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevStreamDestroy(s));
}

void testCopiesOrderedWithLaunches() {
  const int n = 1024;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, n * sizeof(int)));
  mydevStream_t s = newStream();
  CHECK_OK(mydevTestSetStreamDelay(s, 2000));
  struct Fill {
    int* dev;
    int n;
    int value;
  };
  auto fill = [](void* p) {
    auto* f = static_cast<Fill*>(p);
    int* dev = static_cast<int*>(mydevKernelAddress(f->dev));
    for (int i = 0; i < f->n; ++i) dev[i] = f->value + i;
    return 0;
  };
  auto check = [](void* p) {
    auto* f = static_cast<Fill*>(p);
    const int* dev = static_cast<const int*>(mydevKernelAddress(f->dev));
    for (int i = 0; i < f->n; ++i) {
      if (dev[i] != f->value + i) return 1;
    }
    return 0;
  };
  Fill f1{static_cast<int*>(d), n, 100}, f2{static_cast<int*>(d), n, 200}, f3{static_cast<int*>(d), n, 300};
  std::vector<int> h1(n), h2(n), h3(n, -1), src(n);
  for (int i = 0; i < n; ++i) src[i] = 300 + i;
  CHECK_OK(mydevLaunchHostFunc(s, fill, &f1));
  CHECK_OK(mydevMemcpyAsync(h1.data(), d, n * sizeof(int), mydevMemcpyDeviceToHost, s));
  CHECK_OK(mydevLaunchHostFunc(s, fill, &f2));
  CHECK_OK(mydevMemcpyAsync(h2.data(), d, n * sizeof(int), mydevMemcpyDeviceToHost, s));
  CHECK_OK(mydevMemsetAsync(d, 0, n * sizeof(int), s));
  CHECK_OK(mydevMemcpyAsync(d, src.data(), n * sizeof(int), mydevMemcpyHostToDevice, s));
  CHECK_OK(mydevLaunchHostFunc(s, check, &f3));  // sees the host-to-device copy
  CHECK_OK(mydevMemsetAsync(d, 0xff, sizeof(int), s));
  CHECK_OK(mydevMemcpyAsync(h3.data(), d, n * sizeof(int), mydevMemcpyDeviceToHost, s));
  CHECK_OK(mydevStreamSynchronize(s));  // also: the check launch did not fail
  for (int i = 0; i < n; ++i) {
    CHECK(h1[i] == 100 + i);
    CHECK(h2[i] == 200 + i);
  }
  CHECK(h3[0] == -1);
  for (int i = 1; i < n; ++i) CHECK(h3[i] == 300 + i);
  CHECK_OK(mydevStreamDestroy(s));
  CHECK_OK(mydevFree(d));
}

// Runtime calls from inside launched functions: nested enqueues and
// synchronisation of the calling stream itself must not deadlock.
struct Nested {
  std::atomic<int> order{0};
  int inner_seen = -1;
  mydevError_t sync_result = mydevErrorNotReady;
  mydevError_t launch_result = mydevErrorNotReady;
};

int nestedInner(void* p) {
  auto* n = static_cast<Nested*>(p);
  n->inner_seen = n->order.fetch_add(1);
  return 0;
}

int nestedOuter(void* p) {
  auto* n = static_cast<Nested*>(p);
  n->order.fetch_add(1);
  n->launch_result = mydevLaunchHostFunc(nullptr, nestedInner, n);  // own (default) stream
  n->sync_result = mydevStreamSynchronize(nullptr);                // does not wait for itself
  return 0;
}

void testNestedRuntimeCalls() {
  const int n = deviceCount();
  CHECK_OK(mydevSetDevice(n - 1));
  Nested nested;
  CHECK_OK(mydevLaunchHostFunc(nullptr, nestedOuter, &nested));  // default stream of device n - 1
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK_OK(mydevStreamSynchronize(nullptr));  // the nested launch, if it was still queued
  CHECK(nested.launch_result == mydevSuccess);
  CHECK(nested.sync_result == mydevSuccess);
  CHECK(nested.inner_seen == 1);  // ran after its launcher, in stream order
  CHECK_OK(mydevSetDevice(0));

  // Destroying a stream from one of its own tasks. Once destroyed, no
  // synchronisation covers the stream, hence the atomic handshake.
  struct SelfDestroy {
    mydevStream_t stream;
    std::atomic<int> result;
  } sd{newStream(), {-1}};
  CHECK_OK(mydevLaunchHostFunc(sd.stream, [](void* p) {
    auto* x = static_cast<SelfDestroy*>(p);
    x->result.store(mydevStreamDestroy(x->stream));
    return 0;
  }, &sd));
  auto t0 = std::chrono::steady_clock::now();
  while (sd.result.load() == -1 && msSince(t0) < 10000) std::this_thread::yield();
  CHECK(sd.result.load() == mydevSuccess);
  std::atomic<int> flag{0};
  CHECK_ERR(mydevLaunchHostFunc(sd.stream, setFlagKernel, &flag), mydevErrorInvalidResourceHandle);
}

// Destroying a stream while other threads enqueue on it: every enqueue either
// succeeds (and its work runs before Destroy returns) or fails cleanly.
void testDestroyWhileEnqueuing() {
  for (int round = 0; round < 20; ++round) {
    mydevStream_t s = newStream();
    std::atomic<int> ran{0}, accepted{0}, rejected{0}, other{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < 3; ++t) {
      pool.emplace_back([&] {
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < 200; ++i) {
          mydevError_t e = mydevLaunchHostFunc(s, setFlagKernel, &ran);
          if (e == mydevSuccess) accepted++;
          else if (e == mydevErrorInvalidResourceHandle) rejected++;
          else other++;
        }
      });
    }
    go.store(true);
    std::this_thread::sleep_for(std::chrono::microseconds(50 * round));
    CHECK_OK(mydevStreamDestroy(s));
    for (auto& th : pool) th.join();
    CHECK(other.load() == 0);
    CHECK(accepted.load() + rejected.load() == 600);
    CHECK(ran.load() == accepted.load());
  }
}

// Many host threads on shared streams of every device: each stream runs its
// work one task at a time, on its device, and in each producer's order.
struct StressLog {
  int device = 0;
  std::atomic<bool> busy{false};
  std::atomic<int> errors{0};
  std::vector<int> last_seq;  // per producer thread; only the stream's worker touches it
  long count = 0;             // likewise
};

struct StressRec {
  StressLog* log;
  int thread;
  int seq;
};

int stressKernel(void* p) {
  auto* r = static_cast<StressRec*>(p);
  StressLog* log = r->log;
  if (log->busy.exchange(true)) log->errors++;
  int dev = -1;
  mydevGetDevice(&dev);
  if (dev != log->device) log->errors++;
  if (r->seq != log->last_seq[r->thread] + 1) log->errors++;
  log->last_seq[r->thread] = r->seq;
  log->count++;
  log->busy.store(false);
  return 0;
}

void testStress() {
  const int threads = 8, per_device = 1000;
  const int n = std::min(deviceCount(), 2);
  // Per device: the default stream and one created stream, shared by all threads.
  std::vector<mydevStream_t> created(n);
  std::vector<StressLog> logs(2 * n);
  for (int d = 0; d < n; ++d) {
    created[d] = newStream(d, -(d % 2));
    for (int k = 0; k < 2; ++k) {
      logs[2 * d + k].device = d;
      logs[2 * d + k].last_seq.assign(threads, -1);
    }
  }
  std::vector<StressRec> recs(static_cast<size_t>(threads) * n * per_device);
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<int> seq(2 * n, 0);
      for (int i = 0; i < per_device; ++i) {
        for (int d = 0; d < n; ++d) {
          if (mydevSetDevice(d) != mydevSuccess) failures++;
          int k = (i + t) % 2;
          StressLog* log = &logs[2 * d + k];
          StressRec* r = &recs[(static_cast<size_t>(t) * n + d) * per_device + i];
          *r = StressRec{log, t, seq[2 * d + k]++};
          if (mydevLaunchHostFunc(k ? created[d] : nullptr, stressKernel, r) != mydevSuccess) failures++;
          if (i % 97 == 0 && mydevStreamQuery(created[d]) == mydevErrorInvalidResourceHandle) failures++;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  for (int d = 0; d < n; ++d) {
    CHECK_OK(mydevSetDevice(d));
    CHECK_OK(mydevDeviceSynchronize());
  }
  CHECK_OK(mydevSetDevice(0));
  long total = 0;
  for (auto& log : logs) {
    CHECK(log.errors.load() == 0);
    total += log.count;
  }
  CHECK(total == static_cast<long>(threads) * n * per_device);
  for (int d = 0; d < n; ++d) {
    for (int k = 0; k < 2; ++k) {
      // Each thread sent half its launches for device d to each stream.
      long expected = 0;
      for (int t = 0; t < threads; ++t) {
        int mine = 0;
        for (int i = 0; i < per_device; ++i) mine += ((i + t) % 2 == k);
        CHECK(logs[2 * d + k].last_seq[t] == mine - 1);
        expected += mine;
      }
      CHECK(logs[2 * d + k].count == expected);
    }
    CHECK_OK(mydevStreamDestroy(created[d]));
  }
}

// ---- concurrency ----------------------------------------------------------

void testManyThreads() {
  const int threads = 8, iterations = 150;
  const int n = deviceCount();
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto expect = [&](bool ok) {
        if (!ok) failures.fetch_add(1);
      };
      expect(mydevSetDevice(t % n) == mydevSuccess);
      mydevStream_t s = nullptr;
      expect(mydevStreamCreateWithPriority(&s, -(t % 2)) == mydevSuccess);
      mydevEvent_t ev = nullptr;
      expect(mydevEventCreateWithFlags(&ev, 0) == mydevSuccess);
      for (int i = 0; i < iterations; ++i) {
        size_t bytes = 1 + static_cast<size_t>((t * 7919 + i * 104729) % 20000);
        std::vector<unsigned char> in(bytes), out(bytes);
        fillPattern(in, static_cast<unsigned>(t * 1000 + i));
        void* d = nullptr;
        expect(mydevMalloc(&d, bytes) == mydevSuccess);
        expect(mydevMemcpyAsync(d, in.data(), bytes, mydevMemcpyHostToDevice, s) == mydevSuccess);
        expect(mydevLaunchHostFunc(s, [](void* p) { return *static_cast<unsigned char*>(p) == 0xff ? 0 : 0; },
                                   d) == mydevSuccess);
        expect(mydevEventRecord(ev, s) == mydevSuccess);
        expect(mydevMemcpyAsync(out.data(), d, bytes, mydevMemcpyDeviceToHost, s) == mydevSuccess);
        expect(mydevStreamSynchronize(s) == mydevSuccess);
        expect(in == out);
        mydevPointerAttributes attr;
        expect(mydevPointerGetAttributes(&attr, d) == mydevSuccess && attr.base == d && attr.size == bytes &&
               attr.device == t % n);
        expect(mydevFree(d) == mydevSuccess);
      }
      expect(mydevEventDestroy(ev) == mydevSuccess);
      expect(mydevStreamDestroy(s) == mydevSuccess);
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  for (int d = 0; d < n; ++d) CHECK(freeBytes(d) == limitBytes());
}

}  // namespace rt
