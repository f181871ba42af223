// Runtime tests: strict mode (MYDEV_STRICT=1).
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

// ---- strict mode (MYDEV_STRICT=1) -------------------------------------------

struct StrictArgs {
  unsigned char* dev;  // device address
  size_t bytes;
  bool readable_inside = false;        // the kernel address, inside the kernel
  bool device_sealed_inside = false;   // the device address, inside the kernel
  void* allocated_inside = nullptr;
  bool readable_after_nested_copy = false;
};

int strictKernel(void* ud) {
  auto* a = static_cast<StrictArgs*>(ud);
  auto* k = static_cast<unsigned char*>(mydevKernelAddress(a->dev));
  a->readable_inside = hostReadable(k);
  a->device_sealed_inside = !hostReadable(a->dev);  // kernels too must translate
  for (size_t i = 0; i < a->bytes; ++i) k[i] = static_cast<unsigned char>(k[i] + 1);
  // Memory allocated inside a kernel is usable at once through its kernel address...
  if (mydevMalloc(&a->allocated_inside, 64) != mydevSuccess) return 1;
  std::memset(mydevKernelAddress(a->allocated_inside), 0x42, 64);
  // ... and a nested runtime copy changes nothing about what is accessible.
  unsigned char tmp[8];
  if (mydevMemcpy(tmp, a->dev, sizeof(tmp), mydevMemcpyDeviceToHost) != mydevSuccess) return 1;
  if (std::memcmp(tmp, k, sizeof(tmp)) != 0) return 1;
  a->readable_after_nested_copy = hostReadable(k) && !hostReadable(a->dev);
  return 0;
}

int runStrict() {
  CHECK(mydevStrictMode());
  const size_t n = 5000;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, n));
  CHECK(!hostReadable(d));  // sealed from birth
  CHECK(!hostReadable(static_cast<char*>(d) + n + 10));  // including the rounding tail

  std::vector<unsigned char> in(n), out(n);
  fillPattern(in, 5);
  CHECK_OK(mydevMemcpy(d, in.data(), n, mydevMemcpyHostToDevice));
  CHECK(!hostReadable(d));
  CHECK_OK(mydevMemcpy(out.data(), d, n, mydevMemcpyDeviceToHost));
  CHECK(out == in);

  StrictArgs args{static_cast<unsigned char*>(d), n};
  CHECK_OK(mydevLaunchHostFunc(nullptr, strictKernel, &args));
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK(args.readable_inside);
  CHECK(args.device_sealed_inside);
  CHECK(args.readable_after_nested_copy);
  CHECK(!hostReadable(d));  // never opened
  CHECK(args.allocated_inside != nullptr);
  CHECK(!hostReadable(args.allocated_inside));
  CHECK_OK(mydevMemcpy(out.data(), d, n, mydevMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) CHECK(out[i] == static_cast<unsigned char>(in[i] + 1));
  unsigned char inner[64];
  CHECK_OK(mydevMemcpy(inner, args.allocated_inside, 64, mydevMemcpyDeviceToHost));
  for (unsigned char c : inner) CHECK(c == 0x42);

  // Memset, device-to-device and cross-device copies work (through kernel addresses).
  void* e = nullptr;
  CHECK_OK(mydevMalloc(&e, n));
  CHECK_OK(mydevMemsetAsync(e, 9, n, nullptr));
  CHECK_OK(mydevMemcpy(d, e, n, mydevMemcpyDeviceToDevice));
  CHECK_OK(mydevMemcpy(out.data(), d, n, mydevMemcpyDeviceToHost));
  CHECK(out == std::vector<unsigned char>(n, 9));
  if (deviceCount() >= 2) {
    CHECK_OK(mydevSetDevice(1));
    void* f = nullptr;
    CHECK_OK(mydevMalloc(&f, n));
    CHECK(!hostReadable(f));
    CHECK_OK(mydevMemcpy(f, in.data(), n, mydevMemcpyHostToDevice));
    CHECK_OK(mydevSetDevice(0));
    CHECK_OK(mydevMemcpy(e, f, n, mydevMemcpyDeviceToDevice));
    CHECK_OK(mydevMemcpy(out.data(), e, n, mydevMemcpyDeviceToHost));
    CHECK(out == in);
    CHECK_OK(mydevFree(f));
  }
  CHECK(!hostReadable(d));
  CHECK(!hostReadable(e));

  // Pinned host memory is never protected.
  void* h = nullptr;
  CHECK_OK(mydevHostAlloc(&h, 100));
  CHECK(hostReadable(h));
  std::memset(h, 1, 100);
  CHECK_OK(mydevMemcpy(e, h, 100, mydevMemcpyHostToDevice));
  CHECK(hostReadable(h));

  // Concurrent launches and copies from several threads; device addresses
  // stay sealed throughout.
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&] {
      void* mine = nullptr;
      if (mydevMalloc(&mine, 256) != mydevSuccess) failures++;
      for (int i = 0; i < 200; ++i) {
        auto kernel = [](void* p) {
          auto* b = static_cast<unsigned char*>(mydevKernelAddress(p));
          for (int k = 0; k < 256; ++k) b[k] = static_cast<unsigned char>(k);
          return 0;
        };
        if (mydevLaunchHostFunc(nullptr, kernel, mine) != mydevSuccess) failures++;
        unsigned char back[256];
        if (mydevMemcpy(back, mine, 256, mydevMemcpyDeviceToHost) != mydevSuccess) failures++;
        if (back[255] != 255) failures++;
      }
      if (mydevFree(mine) != mydevSuccess) failures++;
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  CHECK(!hostReadable(d));

  // Kernels and async copies on other streams' workers (and devices) reach
  // memory through kernel addresses; device addresses are never opened.
  {
    mydevStream_t s = newStream(deviceCount() - 1);
    CHECK_OK(mydevTestSetStreamDelay(s, 2000));
    StrictArgs args2{static_cast<unsigned char*>(d), n};
    CHECK_OK(mydevMemsetAsync(d, 3, n, s));
    CHECK_OK(mydevLaunchHostFunc(s, strictKernel, &args2));  // d[i] = 4
    CHECK_OK(mydevMemcpyAsync(e, d, n, mydevMemcpyDeviceToDevice, s));
    CHECK_OK(mydevMemcpyAsync(out.data(), e, n, mydevMemcpyDeviceToHost, s));
    CHECK_OK(mydevStreamSynchronize(s));
    CHECK(args2.readable_inside);
    CHECK(args2.device_sealed_inside);
    CHECK(args2.readable_after_nested_copy);
    CHECK(out == std::vector<unsigned char>(n, 4));
    CHECK(!hostReadable(d));
    CHECK(!hostReadable(e));
    CHECK(!hostReadable(args2.allocated_inside));
    CHECK_OK(mydevFree(args2.allocated_inside));
    CHECK_OK(mydevStreamDestroy(s));
  }

  // While a kernel is provably running (blocked on a latch, holding its own
  // allocation's kernel address), device addresses stay sealed: of its
  // allocation and of any other.
  {
    struct Running {
      Latch latch;
      void* dev;
    } running{{}, d};
    mydevStream_t s = newStream();
    // Blocking: the launch returns only once the kernel finished, so it
    // cannot wait for us.
    if (launchBlocking()) running.latch.released.store(true);
    CHECK_OK(mydevLaunchHostFunc(s, [](void* p) {
      auto* r = static_cast<Running*>(p);
      static_cast<unsigned char*>(mydevKernelAddress(r->dev))[0] = 0x77;
      return latchKernel(&r->latch);
    }, &running));
    if (!launchBlocking()) {
      running.latch.waitStarted();
      CHECK(!hostReadable(d));
      CHECK(!hostReadable(e));
      CHECK(!hostReadable(static_cast<char*>(e) + n - 1));
      running.latch.released.store(true);
    }
    CHECK_OK(mydevStreamSynchronize(s));
    CHECK_OK(mydevStreamDestroy(s));
    unsigned char first = 0;
    CHECK_OK(mydevMemcpy(&first, d, 1, mydevMemcpyDeviceToHost));
    CHECK(first == 0x77);
  }

  // A child forked after allocating inherits neither view (MADV_DONTFORK): it
  // can neither read nor change the parent's device memory.
  {
    const size_t m = 2 * pageSize();
    void* f = nullptr;
    CHECK_OK(mydevMalloc(&f, m));
    auto* fk = static_cast<unsigned char*>(mydevKernelAddress(f));
    std::vector<unsigned char> pattern(m);
    fillPattern(pattern, 21);
    std::memcpy(fk, pattern.data(), m);
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      // Nothing is mapped at either address in the child: mapping fresh
      // memory there with MAP_FIXED_NOREPLACE succeeds, and writing it does
      // not reach the parent.
      void* at = mmap(fk, m, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      CHILD_CHECK(at == fk, 30);
      std::memset(at, 0xee, m);
      void* at2 = mmap(f, m, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      CHILD_CHECK(at2 == f, 31);
      std::memset(at2, 0xee, m);
      CHILD_CHECK(mydevKernelAddress(f) == f, 32);  // poisoned: nothing translated
      _exit(0);
    }
    waitChildOk(pid);
    // Touching the kernel address in a child faults (plain SIGSEGV: it is
    // not a device address, so there is no strict-mode report).
    std::fflush(nullptr);
    pid = fork();
    if (pid == 0) {
      volatile unsigned char v = *static_cast<volatile unsigned char*>(static_cast<void*>(fk + 1));
      (void)v;
      _exit(0);
    }
    CHECK(pid > 0);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    // (A sanitizer's own SIGSEGV handler turns the fault into an exit status.)
    CHECK(WIFSIGNALED(status) ? WTERMSIG(status) == SIGSEGV : WEXITSTATUS(status) != 0);
    CHECK(std::memcmp(fk, pattern.data(), m) == 0);
    std::vector<unsigned char> back(m);
    CHECK_OK(mydevMemcpy(back.data(), f, m, mydevMemcpyDeviceToHost));
    CHECK(back == pattern);
    CHECK_OK(mydevFree(f));
  }

  CHECK_OK(mydevFreeHost(h));
  CHECK_OK(mydevFree(args.allocated_inside));
  CHECK_OK(mydevFree(e));
  CHECK_OK(mydevFree(d));
  std::printf("%d passed, 0 failed\n", g_passed);
  return 0;
}

// Host code reading device memory: the handler must report it and abort.
// Prints the faulting address first so the caller can match the message.
int runStrictFault() {
  if (!mydevStrictMode()) return 2;
  int device = deviceCount() >= 2 ? 1 : 0;
  CHECK_OK(mydevSetDevice(device));
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 10000));
  // Device work on a worker first (through the kernel address).
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void* p) {
    static_cast<unsigned char*>(mydevKernelAddress(p))[5000] = 1;
    return 0;
  }, d));
  CHECK_OK(mydevMemsetAsync(d, 2, 100, nullptr));
  CHECK_OK(mydevDeviceSynchronize());
  volatile unsigned char* target = static_cast<unsigned char*>(d) + 5000;
  std::printf("device %d address %p\n", device, const_cast<unsigned char*>(target));
  std::fflush(stdout);
  unsigned char v = *target;  // must not return
  std::printf("read %d without faulting\n", v);
  return 3;
}

// A segfault that has nothing to do with device memory must look like one.
// The point of strict mode's two addresses: host code reading device memory
// while a launched function is provably running (spinning on a latch, using
// its allocation through the kernel address) is still caught. `which` is
// "same" (the running kernel's own allocation, 10000 bytes) or "other"
// (another allocation, 20000 bytes). Before kernels had their own addresses,
// device memory was open to every thread while any kernel ran, and this read
// went unnoticed.
int runStrictFaultWhileRunning(const std::string& which) {
  if (!mydevStrictMode() || launchBlocking()) return 2;
  if (which != "same" && which != "other") return 2;
  int device = deviceCount() >= 2 ? 1 : 0;
  CHECK_OK(mydevSetDevice(device));
  void* mine = nullptr;
  void* other = nullptr;
  CHECK_OK(mydevMalloc(&mine, 10000));
  CHECK_OK(mydevMalloc(&other, 20000));
  CHECK_OK(mydevMemsetAsync(other, 7, 20000, nullptr));
  struct Running {
    Latch latch;
    void* dev;
  };
  static Running running;  // the kernel never finishes; outlives main's frames
  running.dev = mine;
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void* p) {
    auto* r = static_cast<Running*>(p);
    auto* k = static_cast<unsigned char*>(mydevKernelAddress(r->dev));
    for (int i = 0; i < 10000; ++i) k[i] = static_cast<unsigned char>(i);
    return latchKernel(&r->latch);  // spins until released: never
  }, &running));
  running.latch.waitStarted();
  unsigned char* base = static_cast<unsigned char*>(which == "same" ? mine : other);
  volatile unsigned char* target = base + 5000;
  std::printf("kernel running; device %d address %p\n", device, const_cast<unsigned char*>(target));
  std::fflush(stdout);
  unsigned char v = *target;  // must not return
  std::printf("read %d without faulting\n", v);
  return 3;
}

// A launched function that dereferences a device address (forgetting
// mydevKernelAddress) faults with the same report.
int runStrictFaultInKernel() {
  if (!mydevStrictMode()) return 2;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 3000));
  std::printf("device 0 address %p\n", static_cast<void*>(static_cast<char*>(d) + 100));
  std::fflush(stdout);
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void* p) {
    static_cast<volatile unsigned char*>(p)[100] = 1;  // must not return
    return 0;
  }, d));
  mydevDeviceSynchronize();
  std::printf("kernel wrote without faulting\n");
  return 3;
}

// A freed allocation's addresses stay reserved for a while, so a use after
// free faults with a report naming it rather than a plain SIGSEGV (or, once
// the addresses are reused, silently). "device": host code reads the device
// address; "kernel": a launched function writes through the kernel address
// it kept, as a kernel outliving its arguments would.
int runStrictFaultAfterFree(const std::string& which) {
  if (!mydevStrictMode() || (which != "device" && which != "kernel")) return 2;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 6000));
  void* stale = which == "device" ? d : mydevKernelAddress(d);
  void* later = nullptr;
  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevMalloc(&later, 6000));  // takes none of the freed addresses
  CHECK(later != d && mydevKernelAddress(later) != stale);
  unsigned char* target = static_cast<unsigned char*>(stale) + 10;
  std::printf("freed %s address %p\n", which.c_str(), static_cast<void*>(target));
  std::fflush(stdout);
  if (which == "device") {
    unsigned char v = *static_cast<volatile unsigned char*>(target);  // must not return
    std::printf("read %d without faulting\n", v);
    return 3;
  }
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void* p) {
    *static_cast<volatile unsigned char*>(p) = 1;  // must not return
    return 0;
  }, target));
  mydevDeviceSynchronize();
  std::printf("kernel wrote without faulting\n");
  return 3;
}

int runStrictOtherSegv() {
  if (!mydevStrictMode()) return 2;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 100));
  size_t page = pageSize();
  void* foreign = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(foreign != MAP_FAILED);
  std::fflush(stdout);
  volatile unsigned char* target = static_cast<unsigned char*>(foreign);
  unsigned char v = *target;  // must die with SIGSEGV
  std::printf("read %d without faulting\n", v);
  return 3;
}

}  // namespace rt
