// What the runtime tests share: setup queries, small kernels and waits.
#ifndef MYDEV_RUNTIME_TESTS_HELPERS_H
#define MYDEV_RUNTIME_TESTS_HELPERS_H

#include "mydev_runtime.h"
#include "mydev_emulator.h"
#include "mydev_activity.h"
#include "check.h"

// The runtime's test hook for its own tests (src/stream.cpp): how many launches
// onto the stream so far had to wake its worker from sleep.
extern "C" MYDEV_API mydevError_t mydevTestGetStreamWorkerWakes(mydevStream_t stream, unsigned long long* wakes);
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rt {


// In a forked child: report by exit status (the parent CHECKs it is 0).
#define CHILD_CHECK(cond, code) \
  do {                          \
    if (!(cond)) _exit(code);   \
  } while (0)

inline int deviceCount() {
  int n = 0;
  CHECK_OK(mydevGetDeviceCount(&n));
  return n;
}

inline size_t pageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// MYDEV_LAUNCH_BLOCKING=1: every enqueue returns once its work ran. The suite
// runs in both modes and checks what each promises.
inline bool launchBlocking() {
  const char* v = std::getenv("MYDEV_LAUNCH_BLOCKING");
  return v && std::strcmp(v, "1") == 0;
}

// What a failing launch itself returns.
inline mydevError_t launchFailureAtLaunch() { return launchBlocking() ? mydevErrorLaunchFailure : mydevSuccess; }

inline mydevStream_t newStream(int device = -1, int priority = 0) {
  int saved = 0;
  CHECK_OK(mydevGetDevice(&saved));
  if (device >= 0) CHECK_OK(mydevSetDevice(device));
  mydevStream_t s = nullptr;
  CHECK_OK(mydevStreamCreateWithPriority(&s, priority));
  CHECK_OK(mydevSetDevice(saved));
  return s;
}

inline std::string errorLabel(mydevStream_t s) {
  char buf[128];
  std::memset(buf, 'x', sizeof(buf));
  CHECK_OK(mydevStreamGetErrorLabel(s, buf, sizeof(buf)));
  return buf;
}

inline int setFlagKernel(void* ud) {
  static_cast<std::atomic<int>*>(ud)->fetch_add(1);
  return 0;
}

inline int noopKernel(void*) { return 0; }

inline double msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

inline size_t freeBytes(int device) {
  int saved;
  CHECK_OK(mydevGetDevice(&saved));
  CHECK_OK(mydevSetDevice(device));
  size_t free_b = 0, total_b = 0;
  CHECK_OK(mydevMemGetInfo(&free_b, &total_b));
  CHECK_OK(mydevSetDevice(saved));
  return free_b;
}

inline size_t limitBytes() {
  size_t free_b = 0, total_b = 0;
  CHECK_OK(mydevMemGetInfo(&free_b, &total_b));
  return total_b;
}

// Whether the kernel can read the byte at p on our behalf: write(2) into a pipe
// fails with EFAULT for a PROT_NONE page instead of raising SIGSEGV, which
// lets tests observe strict-mode protection without crashing.
inline bool hostReadable(const void* p) {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  ssize_t w = write(fds[1], p, 1);
  int err = errno;
  close(fds[0]);
  close(fds[1]);
  if (w == 1) return true;
  if (w < 0 && err == EFAULT) return false;
  std::abort();
}

inline void fillPattern(std::vector<unsigned char>& v, unsigned seed) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>((i * 31u + seed) & 0xff);
}

inline void waitChildOk(pid_t pid) {
  CHECK(pid > 0);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "child failed: %s %d\n", WIFEXITED(status) ? "exit" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

struct LaunchArgs {
  int* device_buf;  // device memory (device address), written by the "kernel"
  int value;
  int calls;
  int device_seen;
};

// Delays are long enough that the host's next few calls certainly come first.
constexpr unsigned kDelayUs = 30000;

struct Latch {
  std::atomic<bool> started{false};
  std::atomic<bool> released{false};
  void waitStarted() const {
    while (!started.load()) std::this_thread::yield();
  }
};

// Polls until pred() holds, failing the test (instead of hanging it) after
// `seconds`: a deadlock shows as this failure.
template <class Pred>
void waitWithin(Pred pred, int seconds, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "%s: still waiting after %d s (deadlock)\n", what, seconds);
      std::fflush(stderr);
      _exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace rt

#endif  // MYDEV_RUNTIME_TESTS_HELPERS_H
