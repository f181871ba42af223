// The copying CPU fallback, for ops with no mydev kernel: inputs are copied to
// the CPU, the CPU kernel runs, results are copied back. It is slow by design
// and therefore loud: every use is counted, the first use of each op warns, and
// MYDEV_FALLBACK=error turns it into an error naming the op (warn and silent
// are the other settings). View ops never come here: a copy cannot alias.
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "Fallback.h"
#include "hostkernel/HostCall.h"

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
  // Said once, as the runtime says of its own variables, whether or not an op falls back.
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    std::fprintf(stderr, "mydev: ignoring invalid MYDEV_FALLBACK=\"%s\"; using warn (expected warn, silent or error)\n", v);
  }
  return FallbackMode::Warn;
}

std::mutex g_mutex;
std::unordered_map<std::string, int64_t> g_counts;
std::unordered_set<std::string> g_warned;

// track_fallbacks(): while at least one tracker is open, each call is also
// recorded under the dtypes and shapes of its tensor inputs. Off by default,
// because describing every input costs more than the counter.
std::atomic<int> g_tracking{0};
std::map<FallbackSignature, int64_t> g_records;

FallbackSignature describe_inputs(const std::string& name, const c10::FunctionSchema& schema,
                                  const torch::jit::Stack& stack) {
  FallbackSignature sig{name, {}};
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    sig.inputs.push_back({t.scalar_type(), t.sizes().vec()});
  };
  const size_t nargs = schema.arguments().size();
  for (size_t i = stack.size() - nargs; i < stack.size(); ++i) for_each_tensor(stack[i], add);
  return sig;
}

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
  record_fallback(name, op.schema(), *stack);
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&copying_fallback>());
}

} // namespace

void record_fallback(const std::string& name, const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  std::optional<FallbackSignature> sig;
  if (g_tracking.load() > 0) sig = describe_inputs(name, schema, stack);
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_counts[name];
  if (sig) ++g_records[std::move(*sig)];
}

std::unordered_map<std::string, int64_t> fallback_counts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_counts;
}

void check_fallback_setting() {
  (void)fallback_mode();
}

void reset_fallback_counts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_counts.clear();
}

void start_fallback_tracking() {
  ++g_tracking;
}

void stop_fallback_tracking() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_tracking == 0) g_records.clear();
}

std::vector<std::pair<FallbackSignature, int64_t>> fallback_records() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {g_records.begin(), g_records.end()};
}

} // namespace my_device
