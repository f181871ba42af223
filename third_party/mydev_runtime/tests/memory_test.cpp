// Runtime tests: device and pinned memory, pointer attributes.
#include "helpers.h"
#include "runtime_tests.h"

namespace rt {

// ---- memory ---------------------------------------------------------------

void testMallocAccounting() {
  const size_t page = pageSize();
  const size_t limit = limitBytes();
  CHECK(freeBytes(0) == limit);  // nothing leaked by earlier tests

  void* p = reinterpret_cast<void*>(0x1);
  CHECK_OK(mydevMalloc(&p, 0));
  CHECK(p == nullptr);
  CHECK_OK(mydevFree(nullptr));
  CHECK_ERR(mydevMalloc(nullptr, 16), mydevErrorInvalidValue);
  CHECK_ERR(mydevMemGetInfo(nullptr, nullptr), mydevErrorInvalidValue);

  if (limit < 3 * page) return;
  void* a = nullptr;
  CHECK_OK(mydevMalloc(&a, 1));
  CHECK(a != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(a) % page == 0);
  CHECK(freeBytes(0) == limit - page);  // accounted page-rounded
  void* b = nullptr;
  CHECK_OK(mydevMalloc(&b, page + 1));
  CHECK(freeBytes(0) == limit - 3 * page);

  // Plain RW outside strict mode: the host can read what the runtime wrote.
  if (!mydevStrictMode()) CHECK(hostReadable(a));

  if (deviceCount() >= 2) {
    CHECK(freeBytes(1) == limit);  // devices are accounted separately
    CHECK_OK(mydevSetDevice(1));
    void* c = nullptr;
    CHECK_OK(mydevMalloc(&c, 10));
    CHECK_OK(mydevSetDevice(0));
    CHECK(freeBytes(1) == limit - page);
    CHECK(freeBytes(0) == limit - 3 * page);
    CHECK_OK(mydevFree(c));  // freeing from another current device is fine
    CHECK(freeBytes(1) == limit);
  }

  int on_stack = 0;
  CHECK_ERR(mydevFree(&on_stack), mydevErrorInvalidDevicePointer);
  CHECK_ERR(mydevFree(static_cast<char*>(b) + 8), mydevErrorInvalidDevicePointer);  // interior
  CHECK(freeBytes(0) == limit - 3 * page);
  CHECK_OK(mydevFree(a));
  CHECK_ERR(mydevFree(a), mydevErrorInvalidDevicePointer);  // double free
  CHECK_OK(mydevFree(b));
  CHECK(freeBytes(0) == limit);
}

void testOutOfMemory() {
  const size_t page = pageSize();
  const size_t limit = limitBytes();
  if (limit < 2 * page) return;
  CHECK(freeBytes(0) == limit);
  const size_t usable = limit / page * page;
  const size_t half = usable / 2 / page * page;

  void* a = nullptr;
  void* b = nullptr;
  CHECK_OK(mydevMalloc(&a, half));
  CHECK_OK(mydevMalloc(&b, usable - half));
  CHECK(freeBytes(0) == limit - usable);
  unsigned char marker[16];
  std::memset(marker, 0x5a, sizeof(marker));
  CHECK_OK(mydevMemcpy(a, marker, sizeof(marker), mydevMemcpyHostToDevice));

  void* c = reinterpret_cast<void*>(0x1);
  CHECK_ERR(mydevMalloc(&c, 1), mydevErrorMemoryAllocation);
  CHECK(c == nullptr);
  CHECK_ERR(mydevMalloc(&c, limit + 1), mydevErrorMemoryAllocation);
  CHECK_ERR(mydevMalloc(&c, SIZE_MAX), mydevErrorMemoryAllocation);  // rounding would overflow
  CHECK(freeBytes(0) == limit - usable);  // failures account nothing

  // The existing allocations are untouched by the failures.
  unsigned char back[16] = {};
  CHECK_OK(mydevMemcpy(back, a, sizeof(back), mydevMemcpyDeviceToHost));
  CHECK(std::memcmp(back, marker, sizeof(back)) == 0);
  mydevPointerAttributes attr;
  CHECK_OK(mydevPointerGetAttributes(&attr, b));
  CHECK(attr.type == mydevMemoryTypeDevice && attr.size == usable - half);

  if (deviceCount() >= 2) {  // a full device 0 does not limit device 1
    CHECK_OK(mydevSetDevice(1));
    CHECK_OK(mydevMalloc(&c, page));
    CHECK_OK(mydevFree(c));
    CHECK_OK(mydevSetDevice(0));
  }

  CHECK_OK(mydevFree(b));
  CHECK_OK(mydevMalloc(&b, usable - half));  // room again after a free
  CHECK_OK(mydevFree(b));
  CHECK_OK(mydevFree(a));
  CHECK(freeBytes(0) == limit);
}

void testPinnedMemory() {
  void* h = nullptr;
  CHECK_OK(mydevHostAlloc(&h, 1000));
  CHECK(h != nullptr);
  std::memset(h, 7, 1000);  // pinned memory is ordinary host memory
  CHECK(freeBytes(0) == limitBytes());  // and does not use device capacity
  void* z = reinterpret_cast<void*>(0x1);
  CHECK_OK(mydevHostAlloc(&z, 0));
  CHECK(z == nullptr);
  CHECK_ERR(mydevHostAlloc(nullptr, 8), mydevErrorInvalidValue);

  int on_stack = 0;
  CHECK_ERR(mydevFreeHost(&on_stack), mydevErrorInvalidHostPointer);
  CHECK_ERR(mydevFreeHost(static_cast<char*>(h) + 1), mydevErrorInvalidHostPointer);
  CHECK_ERR(mydevFree(h), mydevErrorInvalidDevicePointer);  // pinned is not device memory
  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 16));
  CHECK_ERR(mydevFreeHost(d), mydevErrorInvalidHostPointer);  // nor the other way round
  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevFreeHost(nullptr));
  CHECK_OK(mydevFreeHost(h));
  CHECK_ERR(mydevFreeHost(h), mydevErrorInvalidHostPointer);
}

void testPointerAttributes() {
  mydevPointerAttributes attr{};
  CHECK_ERR(mydevPointerGetAttributes(nullptr, &attr), mydevErrorInvalidValue);

  void* d = nullptr;
  CHECK_OK(mydevMalloc(&d, 1000));
  CHECK_OK(mydevPointerGetAttributes(&attr, d));
  CHECK(attr.type == mydevMemoryTypeDevice);
  CHECK(attr.device == 0);
  CHECK(attr.base == d);
  CHECK(attr.size == 1000);

  CHECK_OK(mydevPointerGetAttributes(&attr, static_cast<char*>(d) + 999));  // interior
  CHECK(attr.type == mydevMemoryTypeDevice && attr.base == d && attr.size == 1000);

  CHECK_OK(mydevPointerGetAttributes(&attr, static_cast<char*>(d) + 1000));  // one past the end
  CHECK(attr.type == mydevMemoryTypeUnregistered);

  if (deviceCount() >= 2) {
    CHECK_OK(mydevSetDevice(1));
    void* d1 = nullptr;
    CHECK_OK(mydevMalloc(&d1, 64));
    CHECK_OK(mydevSetDevice(0));
    CHECK_OK(mydevPointerGetAttributes(&attr, static_cast<char*>(d1) + 10));
    CHECK(attr.type == mydevMemoryTypeDevice && attr.device == 1 && attr.base == d1 && attr.size == 64);
    CHECK_OK(mydevFree(d1));
  }

  void* h = nullptr;
  CHECK_OK(mydevHostAlloc(&h, 300));
  CHECK_OK(mydevPointerGetAttributes(&attr, static_cast<char*>(h) + 5));
  CHECK(attr.type == mydevMemoryTypeHost);
  CHECK(attr.device == -1);
  CHECK(attr.base == h);
  CHECK(attr.size == 300);

  int on_stack = 0;
  std::vector<char> on_heap(10);
  for (const void* p : {static_cast<const void*>(&on_stack), static_cast<const void*>(on_heap.data()),
                        static_cast<const void*>(nullptr)}) {
    attr.type = mydevMemoryTypeDevice;
    CHECK_OK(mydevPointerGetAttributes(&attr, p));
    CHECK(attr.type == mydevMemoryTypeUnregistered);
    CHECK(attr.device == -1);
    CHECK(attr.base == nullptr);
    CHECK(attr.size == 0);
  }

  CHECK_OK(mydevFree(d));
  CHECK_OK(mydevPointerGetAttributes(&attr, d));
  CHECK(attr.type == mydevMemoryTypeUnregistered);  // freed memory is forgotten
  CHECK_OK(mydevFreeHost(h));
  CHECK_OK(mydevPointerGetAttributes(&attr, h));
  CHECK(attr.type == mydevMemoryTypeUnregistered);
}

}  // namespace rt
