#pragma once
#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace my_device {

// How many times each op (by "aten::name.overload") went through the copying fallback.
std::unordered_map<std::string, int64_t> fallback_counts();
void reset_fallback_counts();
// Reads MYDEV_FALLBACK once at load, so that an invalid value is reported then
// (and taken as warn), not at the first op that falls back.
void check_fallback_setting();

// One kind of fallback call: the op and the dtype and shape of each tensor
// input, in argument order (tensor lists flattened, undefined tensors left out).
struct FallbackInput {
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  bool operator<(const FallbackInput& o) const {
    return std::tie(dtype, shape) < std::tie(o.dtype, o.shape);
  }
};
struct FallbackSignature {
  std::string op;
  std::vector<FallbackInput> inputs;
  bool operator<(const FallbackSignature& o) const {
    return std::tie(op, inputs) < std::tie(o.op, o.inputs);
  }
};

// While tracking is on (start/stop nest), fallback_records() holds each
// signature seen since tracking began and its number of calls.
// Counts one call of `name` by a fallback other than the copying one (the
// Lazy backend's), and records its inputs while track_fallbacks() is open.
void record_fallback(const std::string& name, const c10::FunctionSchema& schema, const torch::jit::Stack& stack);

void start_fallback_tracking();
void stop_fallback_tracking();
std::vector<std::pair<FallbackSignature, int64_t>> fallback_records();

} // namespace my_device
