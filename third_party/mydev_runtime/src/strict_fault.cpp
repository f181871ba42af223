// Strict mode's SIGSEGV reporting. Device addresses are PROT_NONE for the
// allocation's whole life (launched functions and copies use the separate
// kernel view, see memory.cpp), so any code that dereferences a device pointer
// faults, whatever else is running; this handler turns that fault into a
// message naming the allocation, then aborts. That includes a launched
// function that forgot mydevKernelAddress: the message is the same. So does
// an access to an allocation freed recently enough that its addresses are
// still reserved (memory.cpp, Freed), through either address. Faults anywhere
// else (live kernel views included) are passed on untouched.
#include "internal.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace mydev_detail {
namespace {

struct sigaction g_previous;

// Minimal formatting, because snprintf is not async-signal-safe.
struct Message {
  char buf[320];
  size_t len = 0;

  void add(const char* s) {
    while (*s && len < sizeof(buf)) buf[len++] = *s++;
  }
  void addHex(uintptr_t v) {
    char digits[2 * sizeof(v)];
    int n = 0;
    do {
      digits[n++] = "0123456789abcdef"[v & 0xf];
      v >>= 4;
    } while (v);
    add("0x");
    while (n > 0 && len < sizeof(buf)) buf[len++] = digits[--n];
  }
  void addDec(uint64_t v) {
    char digits[20];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v);
    while (n > 0 && len < sizeof(buf)) buf[len++] = digits[--n];
  }
};

void writeAll(const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(STDERR_FILENO, p, n);
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void onSegv(int sig, siginfo_t* info, void* context) {
  FaultAllocation a;
  // si_code > 0 means the kernel raised it for a real fault, so si_addr is
  // meaningful (as opposed to kill(2)/raise(3)).
  if (info && info->si_code > 0 &&
      findDeviceAllocationForSignal(reinterpret_cast<uintptr_t>(info->si_addr), &a)) {
    Message m;
    m.add(a.freed ? "mydev strict mode: freed device memory accessed at " :
                    "mydev strict mode: host code accessed device memory at ");
    m.addHex(reinterpret_cast<uintptr_t>(info->si_addr));
    m.add(" (mydev:");
    m.addDec(static_cast<uint64_t>(a.device));
    m.add(" allocation of ");
    m.addDec(a.size);
    if (!a.freed) {
      m.add(" bytes) outside a runtime copy or kernel launch\n");
    } else if (a.kernel_view) {
      m.add(" bytes) through its kernel address: a kernel used it after it was freed\n");
    } else {
      m.add(" bytes) through its device address, after it was freed\n");
    }
    writeAll(m.buf, m.len);
    abort();
  }

  // Not ours: hand the fault to whoever was there before.
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler == SIG_DFL || g_previous.sa_handler == SIG_IGN) {
    // Returning re-executes the faulting instruction, which now faults into
    // the default action and the process dies with SIGSEGV as it would have.
    // (An ignored SIGSEGV from a real fault cannot be survived anyway.)
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGSEGV, &dfl, nullptr);
    return;
  }
  g_previous.sa_handler(sig);
}

}  // namespace

void installStrictFaultHandler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = onSegv;
  sigemptyset(&sa.sa_mask);
  // SA_ONSTACK: use an alternate stack if the program set one (e.g. Python's
  // faulthandler), so a stack overflow still reaches the handler we chain to.
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, &g_previous);
}

}  // namespace mydev_detail
