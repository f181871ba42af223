// The copying CPU fallback, for ops with no mydev kernel: inputs are copied to
// the CPU, the CPU kernel runs, results are copied back. It is slow by design
// and therefore loud: every use is counted, the first use of each op warns, and
// MYDEV_FALLBACK=error turns it into an error naming the op (warn and silent
// are the other settings). View ops never come here: a copy cannot alias.
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "Fallback.h"

namespace my_device {
namespace {

enum class FallbackMode { Warn, Silent, Error };

// Read on every use so tests and users can switch it at run time; the fallback
// is slow enough that a getenv does not show.
FallbackMode fallback_mode() {
  const char* v = std::getenv("MYDEV_FALLBACK");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "warn") == 0) return FallbackMode::Warn;
  if (std::strcmp(v, "silent") == 0) return FallbackMode::Silent;
  if (std::strcmp(v, "error") == 0) return FallbackMode::Error;
  TORCH_CHECK(false, "MYDEV_FALLBACK must be one of warn, silent, error; got '", v, "'");
}

std::mutex g_mutex;
std::unordered_map<std::string, int64_t> g_counts;
std::unordered_set<std::string> g_warned;

void copying_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const std::string name = c10::toString(op.schema().operator_name());
  const FallbackMode mode = fallback_mode();
  TORCH_CHECK_NOT_IMPLEMENTED(mode != FallbackMode::Error, "The operator '", name,
                              "' is not implemented for the mydev device, and MYDEV_FALLBACK=error forbids "
                              "running it on the CPU through the copying fallback.");
  bool first_use = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    first_use = g_warned.insert(name).second;
  }
  if (first_use && mode == FallbackMode::Warn) {
    TORCH_WARN("The operator '", name, "' is not implemented for the mydev device; it ran on the CPU through the "
               "copying fallback, which copies every input and output. my_device.fallback_counts() lists such "
               "ops; MYDEV_FALLBACK=error makes this an error and MYDEV_FALLBACK=silent hides this warning.");
  }
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_counts[name];
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&copying_fallback>());
}

} // namespace

std::unordered_map<std::string, int64_t> fallback_counts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_counts;
}

void reset_fallback_counts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_counts.clear();
}

} // namespace my_device
