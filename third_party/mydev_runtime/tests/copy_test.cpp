// Runtime tests: copies: round trips, kernel addresses, validation.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

// ---- copies ---------------------------------------------------------------

void testCopiesRoundTrip() {
  const size_t n = 10000;
  std::vector<unsigned char> src(n), back(n);
  fillPattern(src, 3);

  void* a = nullptr;
  void* b = nullptr;
  CHECK_OK(mydevMalloc(&a, n));
  CHECK_OK(mydevMalloc(&b, n));
  CHECK_OK(mydevMemcpy(a, src.data(), n, mydevMemcpyHostToDevice));
  CHECK_OK(mydevMemcpy(b, a, n, mydevMemcpyDeviceToDevice));
  CHECK_OK(mydevMemcpy(back.data(), b, n, mydevMemcpyDeviceToHost));
  CHECK(back == src);

  // Interior ranges, and an overlapping copy within one allocation.
  CHECK_OK(mydevMemcpy(static_cast<char*>(a) + 1, a, n - 1, mydevMemcpyDeviceToDevice));
  CHECK_OK(mydevMemcpy(back.data(), a, n, mydevMemcpyDeviceToHost));
  CHECK(back[0] == src[0]);
  CHECK(std::memcmp(back.data() + 1, src.data(), n - 1) == 0);
  unsigned char tail[4] = {};
  CHECK_OK(mydevMemcpy(tail, static_cast<char*>(b) + n - 4, 4, mydevMemcpyDeviceToHost));
  CHECK(std::memcmp(tail, src.data() + n - 4, 4) == 0);

  // Async copies and memset on a created stream, and pinned host buffers.
  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, 0));
  void* pinned = nullptr;
  CHECK_OK(mydevHostAlloc(&pinned, n));
  CHECK_OK(mydevMemsetAsync(a, 0xab, n, s));
  CHECK_OK(mydevStreamSynchronize(s));  // streams are not ordered with each other
  CHECK_OK(mydevMemsetAsync(a, 0x11, 10, nullptr));
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK_OK(mydevMemcpyAsync(pinned, a, n, mydevMemcpyDeviceToHost, s));
  CHECK_OK(mydevStreamSynchronize(s));
  const unsigned char* pb = static_cast<const unsigned char*>(pinned);
  CHECK(pb[0] == 0x11 && pb[9] == 0x11 && pb[10] == 0xab && pb[n - 1] == 0xab);
  std::memcpy(pinned, src.data(), n);
  CHECK_OK(mydevMemcpyAsync(b, pinned, n, mydevMemcpyHostToDevice, s));
  CHECK_OK(mydevMemcpyAsync(back.data(), b, n, mydevMemcpyDeviceToHost, s));
  CHECK_OK(mydevStreamSynchronize(s));
  CHECK(back == src);

  // Across devices.
  if (deviceCount() >= 2) {
    CHECK_OK(mydevSetDevice(1));
    void* c = nullptr;
    CHECK_OK(mydevMalloc(&c, n));
    CHECK_OK(mydevSetDevice(0));
    CHECK_OK(mydevMemcpy(c, b, n, mydevMemcpyDeviceToDevice));
    std::fill(back.begin(), back.end(), 0);
    CHECK_OK(mydevMemcpy(back.data(), c, n, mydevMemcpyDeviceToHost));
    CHECK(back == src);
    CHECK_OK(mydevMemsetAsync(a, 0, n, s));
    CHECK_OK(mydevMemcpyAsync(a, c, n, mydevMemcpyDeviceToDevice, s));  // back from device 1
    CHECK_OK(mydevMemcpy(back.data(), a, n, mydevMemcpyDeviceToHost));  // waits for s
    CHECK(back == src);
    CHECK_OK(mydevFree(c));
  }

  // Zero bytes always succeed, whatever the pointers.
  CHECK_OK(mydevMemcpy(nullptr, nullptr, 0, mydevMemcpyHostToDevice));
  CHECK_OK(mydevMemcpyAsync(nullptr, reinterpret_cast<void*>(0x10), 0, mydevMemcpyDeviceToDevice, s));
  CHECK_OK(mydevMemsetAsync(nullptr, 0, 0, s));

  CHECK_OK(mydevStreamDestroy(s));
  CHECK_OK(mydevFreeHost(pinned));
  CHECK_OK(mydevFree(a));
  CHECK_OK(mydevFree(b));
}

// Device and kernel addresses: distinct in strict mode (same bytes), equal
// otherwise; translation works for interior and one-past-the-end pointers and
// leaves everything else alone.
void testKernelAddresses() {
  const bool strict = mydevStrictMode();
  const size_t n = 1000;
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, n));
  auto* dc = static_cast<unsigned char*>(d);
  auto* k = static_cast<unsigned char*>(mydevKernelAddress(d));
  if (strict) {
    CHECK(k != dc);
    CHECK(reinterpret_cast<uintptr_t>(k) % pageSize() == 0);
    CHECK(!hostReadable(d));  // the device address stays sealed...
    CHECK(hostReadable(k));   // ...the kernel address is open
  } else {
    CHECK(k == dc);
  }
  for (size_t off : {size_t{0}, size_t{1}, size_t{499}, n - 1, n}) {
    CHECK(mydevKernelAddress(dc + off) == k + off);
    CHECK(mydevDeviceAddress(k + off) == dc + off);
    CHECK(mydevDeviceAddress(mydevKernelAddress(dc + off)) == dc + off);
    CHECK(mydevKernelAddress(k + off) == k + off);  // idempotent
    CHECK(mydevDeviceAddress(dc + off) == dc + off);
  }

  // Writes through the kernel address (here from the host thread, which may
  // hold one as well as a kernel may) are what copies of the device address see.
  std::vector<unsigned char> in(n), out(n);
  fillPattern(in, 11);
  std::memcpy(k, in.data(), n);
  CHECK_OK(mydevMemcpy(out.data(), d, n, mydevMemcpyDeviceToHost));
  CHECK(out == in);
  // And what copies write, the kernel address reads.
  fillPattern(in, 12);
  CHECK_OK(mydevMemcpy(d, in.data(), n, mydevMemcpyHostToDevice));
  CHECK(std::memcmp(k, in.data(), n) == 0);
  CHECK_OK(mydevMemsetAsync(dc + 10, 0x5a, 20, nullptr));
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK(k[9] == in[9] && k[10] == 0x5a && k[29] == 0x5a && k[30] == in[30]);

  // Not device memory: unchanged.
  void* h = nullptr;
  CHECK_OK(mydevHostAlloc(&h, 100));
  int local = 0;
  CHECK(mydevKernelAddress(nullptr) == nullptr);
  CHECK(mydevDeviceAddress(nullptr) == nullptr);
  CHECK(mydevKernelAddress(h) == h);
  CHECK(mydevDeviceAddress(h) == h);
  CHECK(mydevKernelAddress(&local) == &local);
  CHECK(mydevDeviceAddress(&local) == &local);
  CHECK(mydevKernelAddress(in.data()) == in.data());
  // The rounding tail beyond one past the end is not translated.
  CHECK(mydevKernelAddress(dc + n + 1) == dc + n + 1);
  CHECK(mydevDeviceAddress(k + n + 1) == k + n + 1);

  // Whole-page allocations (no rounding tail; mmap tends to place mappings
  // side by side): one past the end still translates as the end, and device
  // and kernel addresses are never confused.
  std::vector<void*> pages(6);
  for (auto& p : pages) CHECK_OK(mydevMalloc(&p, pageSize()));
  CHECK(freeBytes(0) == limitBytes() - 6 * pageSize() - pageSize());  // d, 1000 bytes: one page
  for (void* p : pages) {
    auto* pc = static_cast<unsigned char*>(p);
    auto* pk = static_cast<unsigned char*>(mydevKernelAddress(p));
    const size_t ps = pageSize();
    CHECK(strict ? pk != pc : pk == pc);
    CHECK(mydevDeviceAddress(p) == p);
    CHECK(mydevKernelAddress(pk) == pk);
    CHECK(mydevDeviceAddress(pk) == p);
    CHECK(mydevKernelAddress(pc + ps - 1) == pk + ps - 1);
    CHECK(mydevDeviceAddress(pk + ps - 1) == pc + ps - 1);
    CHECK(mydevKernelAddress(pc + ps) == pk + ps);
    CHECK(mydevDeviceAddress(pk + ps) == pc + ps);
    CHECK(mydevKernelAddress(pk + ps) == pk + ps);
    CHECK(mydevDeviceAddress(pc + ps) == pc + ps);
    if (strict) CHECK(!hostReadable(pc + ps));  // the extra page is sealed device memory too
    mydevPointerAttributes attr;
    CHECK_OK(mydevPointerGetAttributes(&attr, pc + ps));
    CHECK(attr.base != p);  // one past the end is not inside the allocation
  }
  // In strict mode no view starts where another ends (outside it, device
  // allocations may well be adjacent, and it does not matter).
  for (void* p : pages) {
    for (void* q : pages) {
      if (!strict || p == q) continue;
      auto* pk = static_cast<unsigned char*>(mydevKernelAddress(p));
      CHECK(mydevKernelAddress(q) != pk + pageSize());
      CHECK(q != static_cast<unsigned char*>(p) + pageSize());
    }
  }

  if (strict) {
    // Kernel addresses are host memory to the rest of the API.
    void* e = nullptr;
    CHECK_OK(mydevMalloc(&e, n));
    auto* ek = static_cast<unsigned char*>(mydevKernelAddress(e));
    mydevPointerAttributes attr;
    CHECK_OK(mydevPointerGetAttributes(&attr, k + 5));
    CHECK(attr.type == mydevMemoryTypeUnregistered && attr.base == nullptr && attr.device == -1);
    CHECK_ERR(mydevFree(k), mydevErrorInvalidDevicePointer);
    CHECK_ERR(mydevMemcpy(ek, in.data(), n, mydevMemcpyHostToDevice), mydevErrorInvalidDevicePointer);
    CHECK_ERR(mydevMemcpy(out.data(), k, n, mydevMemcpyDeviceToHost), mydevErrorInvalidDevicePointer);
    CHECK_ERR(mydevMemsetAsync(k, 0, n, nullptr), mydevErrorInvalidDevicePointer);
    // ... valid as the host side of a copy (a kernel copying into its own view):
    CHECK_OK(mydevMemcpy(ek, d, n, mydevMemcpyDeviceToHost));
    CHECK(std::memcmp(ek, k, n) == 0);
    CHECK_OK(mydevMemsetAsync(e, 0x33, n, nullptr));
    CHECK_OK(mydevMemcpyAsync(dc + 1, ek, 8, mydevMemcpyHostToDevice, nullptr));
    CHECK_OK(mydevStreamSynchronize(nullptr));
    CHECK(k[0] == in[0]);
    for (int i = 1; i <= 8; ++i) CHECK(k[i] == 0x33);
    // ... but a host range running into device memory is not.
    CHECK_ERR(mydevMemcpy(dc, dc - 1, 2, mydevMemcpyHostToDevice), mydevErrorInvalidHostPointer);
    CHECK_OK(mydevFree(e));
  } else {
    // Outside strict mode the kernel address is the device address, so it is
    // not host memory: portable code copies device memory as device memory.
    CHECK_ERR(mydevMemcpy(k, d, 8, mydevMemcpyDeviceToHost), mydevErrorInvalidHostPointer);
  }

  // Launched functions write through the kernel address.
  struct Fill {
    void* dev;
    size_t n;
  } fill{d, n};
  CHECK_OK(mydevLaunchHostFunc(nullptr, [](void* p) {
    auto* f = static_cast<Fill*>(p);
    auto* b = static_cast<unsigned char*>(mydevKernelAddress(f->dev));
    for (size_t i = 0; i < f->n; ++i) b[i] = static_cast<unsigned char>(i ^ 0x5c);
    return 0;
  }, &fill));
  CHECK_OK(mydevStreamSynchronize(nullptr));
  CHECK_OK(mydevMemcpy(out.data(), d, n, mydevMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) CHECK(out[i] == static_cast<unsigned char>(i ^ 0x5c));

  for (void* p : pages) CHECK_OK(mydevFree(p));
  CHECK_OK(mydevFreeHost(h));
  CHECK_OK(mydevFree(d));
  // Freed: nothing to translate any more.
  CHECK(mydevKernelAddress(dc + 1) == dc + 1);
  CHECK(mydevDeviceAddress(k + 1) == k + 1);
}

void testCopyValidation() {
  const size_t n = 100;
  std::vector<unsigned char> host(2 * n, 0xee), pattern(2 * n);
  fillPattern(pattern, 9);
  void* d = nullptr;
  void* e = nullptr;
  CHECK_OK(mydevMalloc(&d, n));
  CHECK_OK(mydevMalloc(&e, n));
  CHECK_OK(mydevMemcpy(d, pattern.data(), n, mydevMemcpyHostToDevice));

  auto deviceUnchanged = [&] {
    std::vector<unsigned char> got(n);
    CHECK_OK(mydevMemcpy(got.data(), d, n, mydevMemcpyDeviceToHost));
    return std::memcmp(got.data(), pattern.data(), n) == 0;
  };
  auto hostUnchanged = [&] {
    for (unsigned char c : host) {
      if (c != 0xee) return false;
    }
    return true;
  };

  // Device side not in any device allocation.
  std::vector<unsigned char> other(n, 1);
  CHECK_ERR(mydevMemcpy(other.data(), host.data(), n, mydevMemcpyHostToDevice), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevMemcpy(host.data(), other.data(), n, mydevMemcpyDeviceToHost), mydevErrorInvalidDevicePointer);
  CHECK(hostUnchanged());
  CHECK(other == std::vector<unsigned char>(n, 1));
  CHECK_ERR(mydevMemcpy(host.data(), nullptr, 1, mydevMemcpyDeviceToHost), mydevErrorInvalidDevicePointer);

  // Ranges running past the end of an allocation, including from the inside.
  CHECK_ERR(mydevMemcpy(d, host.data(), n + 1, mydevMemcpyHostToDevice), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevMemcpy(static_cast<char*>(d) + 50, host.data(), 51, mydevMemcpyHostToDevice),
            mydevErrorInvalidDevicePointer);
  CHECK(deviceUnchanged());
  CHECK_ERR(mydevMemcpy(host.data(), d, n + 1, mydevMemcpyDeviceToHost), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevMemcpy(host.data(), static_cast<char*>(d) + 99, 2, mydevMemcpyDeviceToHost),
            mydevErrorInvalidDevicePointer);
  CHECK(hostUnchanged());
  CHECK_ERR(mydevMemcpy(e, d, n + 1, mydevMemcpyDeviceToDevice), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevMemcpy(d, e, n + 1, mydevMemcpyDeviceToDevice), mydevErrorInvalidDevicePointer);
  CHECK(deviceUnchanged());
  CHECK_ERR(mydevMemsetAsync(d, 0, n + 1, nullptr), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevMemsetAsync(host.data(), 0, 1, nullptr), mydevErrorInvalidDevicePointer);
  CHECK(deviceUnchanged());
  CHECK(hostUnchanged());

  // The host side pointing into device memory: device-to-device in disguise.
  CHECK_ERR(mydevMemcpy(d, e, n, mydevMemcpyHostToDevice), mydevErrorInvalidHostPointer);
  CHECK(deviceUnchanged());
  CHECK_ERR(mydevMemcpy(e, d, n, mydevMemcpyDeviceToHost), mydevErrorInvalidHostPointer);
  // ... also into the page-rounding tail of an allocation.
  CHECK_ERR(mydevMemcpy(static_cast<char*>(e) + n + 8, d, 1, mydevMemcpyDeviceToHost),
            mydevErrorInvalidHostPointer);
  CHECK_ERR(mydevMemcpyAsync(d, static_cast<char*>(e) + 1, 1, mydevMemcpyHostToDevice, nullptr),
            mydevErrorInvalidHostPointer);
  CHECK(deviceUnchanged());
  CHECK_ERR(mydevMemcpy(nullptr, d, 1, mydevMemcpyDeviceToHost), mydevErrorInvalidValue);

  // Pinned memory is host memory, not device memory.
  void* pinned = nullptr;
  CHECK_OK(mydevHostAlloc(&pinned, n));
  CHECK_ERR(mydevMemcpy(pinned, d, n, mydevMemcpyDeviceToDevice), mydevErrorInvalidDevicePointer);
  CHECK_OK(mydevFreeHost(pinned));

  // Freed memory is no longer a valid device pointer.
  void* gone = nullptr;
  CHECK_OK(mydevMalloc(&gone, n));
  CHECK_OK(mydevFree(gone));
  CHECK_ERR(mydevMemcpy(host.data(), gone, 1, mydevMemcpyDeviceToHost), mydevErrorInvalidDevicePointer);

  // Bad kind and bad stream.
  CHECK_ERR(mydevMemcpy(d, host.data(), n, static_cast<mydevMemcpyKind>(0)), mydevErrorInvalidValue);
  CHECK_ERR(mydevMemcpy(d, host.data(), n, static_cast<mydevMemcpyKind>(7)), mydevErrorInvalidValue);
  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, 0));
  CHECK_OK(mydevStreamDestroy(s));
  CHECK_ERR(mydevMemcpyAsync(d, host.data(), n, mydevMemcpyHostToDevice, s), mydevErrorInvalidResourceHandle);
  CHECK_ERR(mydevMemsetAsync(d, 0, n, s), mydevErrorInvalidResourceHandle);
  CHECK(deviceUnchanged());
  CHECK(hostUnchanged());

  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevFree(e));
}

}  // namespace rt
