// Devices: environment, lazy initialisation, fork handling, the per-thread
// current device and device properties.
#include "internal.h"

#include <pthread.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace mydev_detail {
namespace {

constexpr int kDefaultDeviceCount = 2;
// Far above anything useful, but keeps a typo from building millions of
// per-device structures (and fits the int8 device index PyTorch uses).
constexpr int kMaxDeviceCount = 64;
constexpr size_t kDefaultMemoryLimit = size_t(8) << 30;
// CUDA's launch queue holds about this many entries before a launch blocks.
constexpr size_t kDefaultLaunchQueueDepth = 1024;

void warnBadValue(const char* var, const char* value, const char* fallback) {
  std::fprintf(stderr, "mydev: ignoring invalid %s=\"%s\"; using %s\n", var, value, fallback);
}

std::string trimmed(const char* s) {
  std::string v(s);
  size_t b = 0, e = v.size();
  while (b < e && std::isspace(static_cast<unsigned char>(v[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(v[e - 1]))) --e;
  return v.substr(b, e - b);
}

// Parses digits by hand rather than with strtoull, which would accept a sign
// ("-5G" wrapping to a huge limit) and leading junk.
bool parseUnsigned(const std::string& s, size_t* pos, uint64_t* out) {
  uint64_t v = 0;
  size_t i = *pos;
  if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
    unsigned d = static_cast<unsigned>(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *pos = i;
  *out = v;
  return true;
}

bool parseDeviceCount(const std::string& s, int* out) {
  size_t pos = 0;
  uint64_t v = 0;
  if (!parseUnsigned(s, &pos, &v) || pos != s.size()) return false;
  if (v < 1 || v > static_cast<uint64_t>(kMaxDeviceCount)) return false;
  *out = static_cast<int>(v);
  return true;
}

// Plain digits; 0 is valid (no limit).
bool parseQueueDepth(const std::string& s, size_t* out) {
  size_t pos = 0;
  uint64_t v = 0;
  if (!parseUnsigned(s, &pos, &v) || pos != s.size() || v > SIZE_MAX) return false;
  *out = static_cast<size_t>(v);
  return true;
}

// "<digits>[K|M|G|T][B]", case-insensitive, powers of 1024. Zero is rejected:
// a device that can hold nothing is a mistake, not a configuration.
bool parseByteSize(const std::string& s, size_t* out) {
  size_t pos = 0;
  uint64_t v = 0;
  if (!parseUnsigned(s, &pos, &v)) return false;
  unsigned shift = 0;
  if (pos < s.size()) {
    switch (std::toupper(static_cast<unsigned char>(s[pos]))) {
      case 'K': shift = 10; ++pos; break;
      case 'M': shift = 20; ++pos; break;
      case 'G': shift = 30; ++pos; break;
      case 'T': shift = 40; ++pos; break;
      default: break;
    }
  }
  if (pos < s.size() && std::toupper(static_cast<unsigned char>(s[pos])) == 'B') ++pos;
  if (pos != s.size() || v == 0) return false;
  if (shift && v > (UINT64_MAX >> shift)) return false;
  v <<= shift;
  if (v > SIZE_MAX) return false;
  *out = static_cast<size_t>(v);
  return true;
}

// "0" or "1"; anything else warns and means 0.
bool parseFlag(const char* var) {
  const char* raw = std::getenv(var);
  if (!raw || !*raw) return false;
  std::string v = trimmed(raw);
  if (v == "1") return true;
  if (v != "0") warnBadValue(var, raw, "0 (expected 0 or 1)");
  return false;
}

Config parseEnvironment() {
  Config c{kDefaultDeviceCount, kDefaultMemoryLimit, false, false, kDefaultLaunchQueueDepth};
  // An empty variable is treated as unset, the usual shell idiom for clearing one.
  if (const char* raw = std::getenv("MYDEV_DEVICE_COUNT"); raw && *raw) {
    if (!parseDeviceCount(trimmed(raw), &c.device_count)) {
      c.device_count = kDefaultDeviceCount;
      warnBadValue("MYDEV_DEVICE_COUNT", raw, "2 (must be an integer from 1 to 64)");
    }
  }
  if (const char* raw = std::getenv("MYDEV_MEMORY_LIMIT"); raw && *raw) {
    if (!parseByteSize(trimmed(raw), &c.memory_limit)) {
      c.memory_limit = kDefaultMemoryLimit;
      warnBadValue("MYDEV_MEMORY_LIMIT", raw, "8G (expected bytes with optional K/M/G/T suffix)");
    }
  }
  if (const char* raw = std::getenv("MYDEV_LAUNCH_QUEUE_DEPTH"); raw && *raw) {
    if (!parseQueueDepth(trimmed(raw), &c.launch_queue_depth)) {
      c.launch_queue_depth = kDefaultLaunchQueueDepth;
      warnBadValue("MYDEV_LAUNCH_QUEUE_DEPTH", raw, "1024 (expected a count of tasks, 0 for no limit)");
    }
  }
  c.strict = parseFlag("MYDEV_STRICT");
  c.launch_blocking = parseFlag("MYDEV_LAUNCH_BLOCKING");
  return c;
}

std::atomic<bool> g_initialized{false};
// Set in the child of a fork taken after initialisation: the child has the
// parent's registry and mappings, but not its threads, and locks another
// thread held at fork time stay held forever. Refusing is the honest answer.
std::atomic<bool> g_poisoned_child{false};
std::once_flag g_init_once;

void onForkChild() {
  // Only registered by initialise(), so reaching here means the parent had
  // initialised.
  g_poisoned_child.store(true, std::memory_order_release);
}

void initialise() {
  const Config& c = config();
  initMemoryRegistry();
  initDefaultStreams();  // also arranges for stream workers to be stopped at exit
  if (c.strict) installStrictFaultHandler();
  pthread_atfork(nullptr, nullptr, onForkChild);
  g_initialized.store(true, std::memory_order_release);
}

MYDEV_HOT_TLS thread_local int t_current_device = 0;

}  // namespace

const Config& config() {
  // Function-local static: thread-safe one-time parse, and trivially
  // destructible so it stays valid during static destruction.
  static const Config c = parseEnvironment();
  return c;
}

mydevError_t ensureInitialized() {
  if (inPoisonedChild()) return mydevErrorInitializationError;
  // Every entry point passes here; call_once alone costs a TLS lookup and a call.
  if (g_initialized.load(std::memory_order_acquire)) return mydevSuccess;
  std::call_once(g_init_once, initialise);
  return mydevSuccess;
}

bool inPoisonedChild() { return g_poisoned_child.load(std::memory_order_acquire); }

int currentDevice() { return t_current_device; }
void setCurrentDevice(int device) { t_current_device = device; }
bool validDevice(int device) { return device >= 0 && device < config().device_count; }

}  // namespace mydev_detail

using namespace mydev_detail;

extern "C" {

mydevError_t mydevGetDeviceCount(int* count) {
  if (!count) return mydevErrorInvalidValue;
  *count = config().device_count;
  return mydevSuccess;
}

int mydevIsInitialized(void) { return g_initialized.load(std::memory_order_acquire) ? 1 : 0; }

int mydevStrictMode(void) {
  // Counts as use (the header's rule), and in strict mode initialising is what
  // installs the fault handler, so "strict" is only reported once it is armed.
  // In a poisoned child the answer is still the configuration.
  (void)ensureInitialized();
  return config().strict ? 1 : 0;
}

int mydevLaunchBlocking(void) {
  (void)ensureInitialized();  // counts as use, as mydevStrictMode does
  return config().launch_blocking ? 1 : 0;
}

mydevError_t mydevGetDevice(int* device) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!device) return mydevErrorInvalidValue;
  *device = currentDevice();
  return mydevSuccess;
}

mydevError_t mydevSetDevice(int device) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!validDevice(device)) return mydevErrorInvalidDevice;
  setCurrentDevice(device);
  return mydevSuccess;
}

mydevError_t mydevGetDeviceProperties(mydevDeviceProp* prop, int device) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (!prop) return mydevErrorInvalidValue;
  if (!validDevice(device)) return mydevErrorInvalidDevice;
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "%s", "mydev emulated accelerator");
  prop->totalGlobalMem = config().memory_limit;
  unsigned hw = std::thread::hardware_concurrency();
  prop->multiProcessorCount = hw ? static_cast<int>(hw) : 1;
  prop->major = 1;
  prop->minor = 0;
  return mydevSuccess;
}

mydevError_t mydevDeviceSynchronize(void) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (mydevError_t e = checkDeviceWait(currentDevice())) return e;
  return synchronizeDevice(currentDevice());
}

mydevError_t mydevDeviceWaitIdle(void) {
  if (mydevError_t e = ensureInitialized()) return e;
  if (mydevError_t e = checkDeviceWait(currentDevice())) return e;
  waitDeviceIdle(currentDevice());
  return mydevSuccess;
}

}  // extern "C"
