// Host kernels that are queued on the stream instead of run in stream order now.
//
// A CPU kernel decides its output shapes while it runs, which is why host
// kernels normally run on the calling thread (launch_inline). But most ops have
// a Meta kernel that computes exactly those shapes without touching data, and
// an out= overload. For them the call is split, as a GPU backend splits it:
//   now (host):   device checks, the Meta kernel (shape, dtype and argument
//                 errors are raised here, at the call, not at a later sync),
//                 allocation of the outputs on the device;
//   later (worker): the CPU out= kernel (or in-place kernel) on host aliases of
//                 the device memory, writing into those outputs.
// Ops without a Meta kernel, linear algebra that checks its results
// (queue_policy), and calls whose Meta kernel fails stay on the inline path,
// which reproduces the CPU's own behaviour and error messages.
//
// Eligible calls are queued at any size. Most of torch 2.13's Meta kernels are
// Python functions (torch/_meta_registrations.py overrides the C++ ones),
// costing 10-550 us a call, so their answers are cached by call signature
// (MetaCache); a training loop then runs each one once. Queueing small calls
// costs about a microsecond more per op than running them at the call, but
// every op run at the call first waits for the stream's queue to drain, so
// mixing the two costs more: the demo's training step measured 1.26-1.59x CPU
// with calls under 2^18 elements at the call, 0.98-1.02x with all queued.
// MYDEV_QUEUE_MIN_ELEMENTS (the elements of all tensor arguments together)
// sets a size below which calls run at the call instead.
#include "QueuedHostKernel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "Factory.h"
#include "HostKernel.h"
#include "core/Generator.h"
#include "core/KernelArgs.h"
#include "core/Launch.h"
#include "core/TensorImpl.h"

namespace my_device {
namespace {

constexpr c10::DeviceType kCPU = c10::DeviceType::CPU;

// Functional: outputs allocated at the call, the out= overload queued.
// FunctionalCopy: the same for ops whose out= overload has no CPU kernel
// (PyTorch generates it: layer norm, relu, flip, ...): the functional CPU
// kernel is queued and its results copied into the outputs.
// InPlace: `self_` written and returned.
// Out: an out= overload called directly, by the user or by a composite kernel
// (mul_.Scalar is mul.out into self; the optimizers' _foreach_mul_ reaches it):
// the caller's outputs are written and returned.
enum class Kind { Inline, Functional, FunctionalCopy, InPlace, Out };

// The Meta kernel's answers by call signature. The Python Meta kernels cost
// 10-550 us a call (clamp's runs torch._refs' type promotion), more than most
// kernels they plan; but their answer depends only on the arguments'
// dtypes, geometries and non-tensor values, so a training loop, which repeats
// the same calls, asks each signature once. Calls whose Meta kernel raised are
// not cached, so their errors are raised every time.
// An entry without specs is a call that stays inline (an optional output the
// call does not ask for, which an out= overload cannot leave out).
using Specs = std::optional<std::vector<OutputSpec>>;
class MetaCache {
 public:
  bool find(const std::string& key, Specs& out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    out = it->second;
    return true;
  }
  void insert(std::string key, Specs specs) {
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= kMaxEntries) map_.clear();  // shapes that keep changing: start over
    map_.emplace(std::move(key), std::move(specs));
  }

 private:
  static constexpr size_t kMaxEntries = 512;
  std::mutex mu_;
  std::unordered_map<std::string, Specs> map_;
};

// Dtype signatures (the scalar types of a call's tensors, in order, each with
// whether the tensor is contiguous) whose CPU kernel is known to exist: see
// queueable_dtype. A first run that gave outputs of other sizes or dtypes than the Meta
// kernel's answer disables queueing for the op (`refuted`): its Meta kernel
// cannot be trusted to shape the outputs a queued call hands out at once.
class VerifiedDtypes {
 public:
  bool contains(const std::string& signature) {
    std::lock_guard<std::mutex> lock(mu_);
    return set_.count(signature) != 0;
  }
  void insert(std::string signature) {
    std::lock_guard<std::mutex> lock(mu_);
    set_.insert(std::move(signature));
  }
  void refute() {
    refuted_.store(true, std::memory_order_relaxed);
  }
  bool refuted() const {
    return refuted_.load(std::memory_order_relaxed);
  }

 private:
  std::mutex mu_;
  std::unordered_set<std::string> set_;
  std::atomic<bool> refuted_{false};
};

struct Plan {
  Kind kind = Kind::Inline;
  std::optional<c10::OperatorHandle> out_op;  // Functional: the out= overload
  std::string label;                          // "aten::name.overload", for failure reports
  std::unique_ptr<MetaCache> meta_cache = std::make_unique<MetaCache>();
  std::unique_ptr<VerifiedDtypes> verified = std::make_unique<VerifiedDtypes>();
  bool floating_known = false;  // float/double calls need no first run at the call
};

// The families whose CPU kernels are known to have float, double and bool
// loops, by base name: their float and double calls are queued from the
// first (see queueable_dtype). Every other op with a Meta kernel is queued too
// (queue_policy), once a call with the same dtypes ran at the call. Indexing,
// gathers and scatters and the class-target losses are listed although their
// CPU kernels reject an index out of range: as a GPU's device-side assert,
// that error is reported at the next synchronisation, naming the op (and the
// device stays usable). Run at the call instead, they made the host wait for
// the stream on every call (twice a training step, for the loss), where CUDA
// does not; sync debug mode reported them.
const std::unordered_set<std::string>& queueable() {
  static const std::unordered_set<std::string> names = [] {
    std::unordered_set<std::string> n;
    for (const char* base : {
             // pointwise arithmetic, comparisons, logic and unary math
             "add", "sub", "mul", "div", "remainder", "fmod", "pow", "maximum", "minimum", "fmax", "fmin",
             "atan2", "hypot", "copysign", "lerp", "addcmul", "addcdiv", "xlogy", "rsub", "clamp", "clamp_min",
             "clamp_max", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
             "logical_not", "isnan", "isinf", "signbit", "abs", "neg", "sign", "sgn", "sqrt", "rsqrt", "exp",
             "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
             "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sigmoid", "logit", "erf", "erfc", "erfinv",
             "floor", "ceil", "round", "trunc", "frac", "reciprocal", "nan_to_num", "where", "isneginf", "isposinf",
             // activations and their backward kernels
             "relu", "gelu", "gelu_backward", "silu", "silu_backward", "hardtanh", "hardtanh_backward",
             "threshold", "threshold_backward", "leaky_relu", "leaky_relu_backward", "elu", "elu_backward",
             "softplus", "softplus_backward", "hardsigmoid", "hardsigmoid_backward", "hardswish",
             "hardswish_backward", "mish", "mish_backward", "sigmoid_backward", "tanh_backward",
             // reductions and scans
             "sum", "mean", "prod", "amax", "amin", "std", "var", "norm", "linalg_vector_norm", "logsumexp",
             "cumsum", "cumprod",
             // matrix products
             "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "addr",
             // softmax, normalisation, pooling
             "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "mse_loss",
             "mse_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward", "huber_loss", "huber_loss_backward",
             "native_layer_norm", "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward",
             "avg_pool2d", "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
             "upsample_nearest2d", "upsample_nearest2d_backward", "upsample_bilinear2d",
             "upsample_bilinear2d_backward",
             // max pooling (its backward takes int64 `indices`); batch norm (see
             // fix_specs). (The optimizers' _foreach_ ops need no entry: they have no
             // CPU kernel, and decompose into per-tensor ops queued here.)
             "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "native_batch_norm",
             "native_batch_norm_backward",
             // reductions with indices, selections and sorting
             "argmax", "argmin", "max", "min", "aminmax", "topk", "sort", "var_mean", "std_mean", "any", "all",
             "cummax", "cummin", "masked_fill",
             // filling and shaping copies
             "fill", "zero", "tril", "triu", "flip", "roll", "cat", "arange",
             // random sampling with scalar parameters (see check_arguments_on_empty_cpu)
             "normal", "uniform", "random", "bernoulli", "exponential", "log_normal", "cauchy", "geometric",
             // indexing, gathers and scatters, class-target losses: an index out of
             // range fails on the worker and is reported at the next synchronisation
             "index_select", "index", "index_put", "_index_put_impl", "gather", "scatter", "scatter_add",
             "scatter_reduce", "index_add", "index_copy", "index_fill", "take", "embedding_dense_backward",
             "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward"}) {
      n.insert(std::string("aten::") + base);
    }
    return n;
  }();
  return names;
}

// Linear algebra that checks its results' `info` and raises (a matrix that is
// singular, not positive-definite, or an algorithm that did not converge)
// stays at the call: CUDA's kernels for these read `info` on the host, and so
// synchronise, to raise there. LAPACK ops that cannot fail on values are
// queued like any other op.
bool checks_lapack_info(const std::string& name) {
  static const std::unordered_set<std::string> never_fail = {
      "aten::linalg_vector_norm", "aten::linalg_cross",   "aten::linalg_matrix_exp",
      "aten::linalg_solve_triangular", "aten::linalg_householder_product", "aten::linalg_lu"};
  if (never_fail.count(name)) return false;
  if (name.rfind("aten::linalg_", 0) == 0 || name.rfind("aten::_linalg_", 0) == 0) return true;
  return name == "aten::cholesky" || name == "aten::cholesky_inverse" || name == "aten::_cholesky_solve_helper";
}

// Whether an op (by base name) may be queued, and whether its float and double
// kernels are known to exist. An op with a Meta kernel has output shapes that
// follow from its arguments' shapes and values: the Meta kernels of ops whose
// shapes depend on the data (nonzero, masked_select, unique, boolean indexing,
// repeat_interleave without output_size) raise, which keeps those at the call,
// where CUDA synchronises too.
//
// A few Meta kernels disagree with their CPU kernels in ways a first run at
// the call cannot show (confirm_queueable_dtypes catches the others), so
// those ops stay at the call too (found by the conformance sweep):
//  - masked_scatter_: Meta accepts a mask that does not broadcast to self,
//    which the CPU kernel rejects;
//  - _embedding_bag*: Meta sizes offset2bag and bag_size differently from the
//    CPU kernel, depending on the mode;
//  - triangular_solve, ormqr: their out= kernels lay a resized output out
//    column-major, where Meta makes it row-major.
enum class QueuePolicy { Never, AnyDtypeVerified, FloatingKnown };
QueuePolicy queue_policy(const std::string& base) {
  static const std::unordered_set<std::string> meta_disagrees = {
      "aten::masked_scatter", "aten::_embedding_bag", "aten::_embedding_bag_forward_only",
      "aten::triangular_solve", "aten::ormqr"};
  if (queueable().count(base)) return QueuePolicy::FloatingKnown;
  if (checks_lapack_info(base) || meta_disagrees.count(base)) return QueuePolicy::Never;
  return QueuePolicy::AnyDtypeVerified;
}

// Ops whose CPU out= kernel (torch 2.13) must not be used, so their functional
// kernel is queued and its results copied (Kind::FunctionalCopy):
//  - native_batch_norm's computes wrong values for an input that is not
//    contiguous in some memory format, and rejects the float statistics of a
//    half or bfloat16 input;
//  - the pointwise losses', given the 0-dim output of a reduction, first resize
//    it to the inputs' shape, with PyTorch's resize warning, on every call.
// test_async.py's test_cpu_out_kernels_still_mishandle_* notice when PyTorch
// fixes them.
bool avoid_out_kernel(const std::string& name) {
  return name == "aten::native_batch_norm" || name == "aten::native_batch_norm_backward" ||
         name == "aten::mse_loss" || name == "aten::smooth_l1_loss" || name == "aten::huber_loss" ||
         name == "aten::binary_cross_entropy";
}

// Overloads whose CPU kernels check the values of a tensor argument: the
// probabilities of bernoulli(self) and bernoulli_(p), normal's std tensors.
bool checks_tensor_values(const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  const std::string& overload = schema.overload_name();
  if (name == "aten::bernoulli" || name == "aten::bernoulli_") return overload != "p" && overload != "float" &&
                                                                        overload != "float_out";
  if (name == "aten::normal") return overload.rfind("float_Tensor", 0) == 0 || overload.rfind("Tensor_Tensor", 0) == 0;
  return false;
}

// Ops whose integer kernels raise on values (division by zero, a negative
// integer power): with integer tensors only these run at the call. (With a
// floating tensor among them, as in nanmean's sum / count, the division is a
// floating one and cannot raise.)
bool integer_values_checked(const std::string& name) {
  for (const char* op : {"aten::div", "aten::div_", "aten::remainder", "aten::remainder_", "aten::fmod", "aten::fmod_",
                         "aten::pow", "aten::pow_", "aten::floor_divide", "aten::floor_divide_"}) {
    if (name == op) return true;
  }
  return false;
}

// Scalar arguments are checked by CPU kernels that Meta kernels do not all
// repeat: the random in-place ops' parameters (uniform_'s range, random_'s
// bounds, bernoulli_'s p), and, in pointwise ops, whether a number fits the
// tensors' dtype (fill_(1e300) on float, masked_fill of 1e30 into int64).
// Running the CPU kernel on empty tensors of the arguments' dtypes, with a
// generator of its own, makes those checks without computing or drawing
// anything, and raises the CPU's error here, at the call, as CUDA checks a
// scalar on the host before launching. Before the device's generator is drawn
// from, so a failed call leaves its stream of numbers as it was.
bool has_scalar_checks(const c10::FunctionSchema& schema) {
  static const std::unordered_set<std::string> names = [] {
    std::unordered_set<std::string> n;
    for (const char* base : {"fill", "masked_fill", "clamp", "clamp_min", "clamp_max", "threshold", "hardtanh",
                             "leaky_relu", "elu", "softplus", "nan_to_num", "lerp", "addcmul", "addcdiv", "where"}) {
      n.insert(std::string("aten::") + base);
      n.insert(std::string("aten::") + base + "_");
    }
    return n;
  }();
  if (!names.count(schema.name())) return false;
  for (const auto& a : schema.arguments()) {
    const auto kind = a.type()->kind();
    if (kind == c10::TypeKind::NumberType) return true;
    if (auto opt = a.type()->cast<c10::OptionalType>()) {
      if (opt->getElementType()->kind() == c10::TypeKind::NumberType) return true;
    }
  }
  return false;
}

void check_arguments_on_empty_cpu(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, Kind kind) {
  const auto& schema = op.schema();
  const auto& params = schema.arguments();
  const bool random = kind == Kind::InPlace && std::any_of(params.begin(), params.end(), is_optional_generator);
  if (!random && !has_scalar_checks(schema)) return;
  static const at::Generator scratch = at::make_generator<at::CPUGeneratorImpl>();
  torch::jit::Stack stack;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor() && v.toTensor().defined()) {
      stack.push_back(at::empty({0}, at::TensorOptions(v.toTensor().scalar_type())));
    } else if (is_optional_generator(params[i])) {
      stack.push_back(scratch);
    } else {
      stack.push_back(v);
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
}

// Corrects the Meta kernel's answer where it differs from the CPU kernel's;
// false if the call must run at the call.
//  - native_group_norm and its backward: the CPU kernels reject an input not
//    contiguous in its suggested memory format, which Meta does not check.
//  - native_layer_norm: the CPU gives a half or bfloat16 input statistics of
//    its own dtype, Meta float ones.
//  - native_batch_norm: in eval mode the CPU returns empty save_mean and
//    save_invstd; the statistics are float only for a half or bfloat16 input
//    with float parameters (Meta makes them float for any half input); and
//    parameters of another dtype than the input are otherwise an error of the
//    CPU kernel (Meta promotes them).
bool fix_specs(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args,
               std::vector<OutputSpec>& specs) {
  if (schema.name() == "aten::native_group_norm" || schema.name() == "aten::native_group_norm_backward") {
    for (const c10::IValue& v : args) {
      if (v.isTensor() && v.toTensor().defined() &&
          !v.toTensor().is_contiguous(v.toTensor().suggest_memory_format())) {
        return false;
      }
    }
    return true;
  }
  if (schema.name() == "aten::multilabel_margin_loss_forward") {
    // With reduction='none', the CPU gives a 1-d input a 0-d loss, the Meta kernel a [1] one.
    if (args[0].toTensor().dim() <= 1) {
      specs[0].sizes.clear();
      specs[0].strides.clear();
    }
    return true;
  }
  if (schema.name() == "aten::native_layer_norm") {
    for (size_t k = 1; k <= 2; ++k) specs[k].dtype = args[0].toTensor().scalar_type();
    return true;
  }
  if (schema.name() != "aten::native_batch_norm") return true;
  const at::ScalarType input = args[0].toTensor().scalar_type();
  const bool reduced = input == at::kHalf || input == at::kBFloat16;
  bool float_params = false;
  for (size_t i = 1; i <= 4; ++i) {
    if (!args[i].isTensor() || !args[i].toTensor().defined()) continue;
    const at::ScalarType p = args[i].toTensor().scalar_type();
    if (p == input) continue;
    if (!(reduced && p == at::kFloat)) return false;
    float_params = true;
  }
  if (float_params) {
    for (size_t i = 1; i <= 4; ++i) {
      if (args[i].isTensor() && args[i].toTensor().defined() && args[i].toTensor().scalar_type() != at::kFloat) {
        return false;  // a mix of half and float parameters
      }
    }
  }
  const bool training = args[*schema.argumentIndexWithName("training")].toBool();
  for (size_t k = 1; k <= 2; ++k) {
    specs[k].dtype = float_params ? at::kFloat : input;
    if (!training) {
      specs[k].sizes = {0};
      specs[k].strides = {1};
    }
  }
  return true;
}

bool writes(const c10::Argument& a) {
  return a.alias_info() != nullptr && a.alias_info()->isWrite();
}

bool is_plain_tensor(const c10::TypePtr& type) {
  return type->kind() == c10::TypeKind::TensorType;
}

// The out= overload of a functional op: same name, the same arguments, then one
// written keyword-only Tensor per return.
std::optional<c10::OperatorHandle> find_out_overload(const c10::FunctionSchema& functional) {
  const auto& args = functional.arguments();
  const size_t nouts = functional.returns().size();
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name != functional.name() || name.overload_name == functional.overload_name()) continue;
    auto handle = c10::Dispatcher::singleton().findOp(name);
    if (!handle || !handle->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
    const auto& cand = handle->schema().arguments();
    if (cand.size() != args.size() + nouts) continue;
    bool same = true;
    for (size_t i = 0; i < args.size() && same; ++i) {
      same = cand[i].name() == args[i].name() && *cand[i].type() == *args[i].type() &&
             writes(cand[i]) == writes(args[i]);
    }
    for (size_t i = args.size(); i < cand.size() && same; ++i) {
      same = cand[i].kwarg_only() && writes(cand[i]) && is_plain_tensor(cand[i].type());
    }
    if (same) return handle;
  }
  return std::nullopt;
}

Plan make_plan(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  Plan plan;
  plan.label = schema.overload_name().empty() ? schema.name() : schema.name() + "." + schema.overload_name();
  std::string base = schema.name();
  if (base.size() > 1 && base.back() == '_' && base[base.size() - 2] != '_') base.pop_back();
  const QueuePolicy policy = queue_policy(base);
  if (policy == QueuePolicy::Never || !op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) {
    return plan;
  }
  plan.floating_known = policy == QueuePolicy::FloatingKnown;
  const auto& args = schema.arguments();
  size_t written = 0;
  for (const auto& a : args) written += writes(a) ? 1 : 0;
  if (schema.returns().empty()) return plan;
  for (const auto& r : schema.returns()) {
    if (!is_plain_tensor(r.type())) return plan;
  }
  if (checks_tensor_values(schema)) return plan;
  if (written == 0) {
    for (const auto& r : schema.returns()) {
      if (r.alias_info() != nullptr) return plan;  // a view
    }
    if (!avoid_out_kernel(schema.name())) plan.out_op = find_out_overload(schema);
    plan.kind = plan.out_op ? Kind::Functional : Kind::FunctionalCopy;
  } else if (written == 1 && writes(args[0]) && !args[0].kwarg_only() && schema.returns().size() == 1 &&
             schema.returns()[0].alias_info() != nullptr && schema.name().back() == '_') {
    plan.kind = Kind::InPlace;
  } else if (written == schema.returns().size()) {
    // Every written argument a keyword-only plain Tensor, returned in order.
    size_t r = 0;
    for (const auto& a : args) {
      if (!writes(a)) continue;
      const auto* alias = schema.returns()[r++].alias_info();
      if (!a.kwarg_only() || !is_plain_tensor(a.type()) || alias == nullptr || !alias->isWrite() ||
          alias->beforeSets() != a.alias_info()->beforeSets()) {
        return plan;
      }
    }
    if (!avoid_out_kernel(schema.name())) plan.kind = Kind::Out;
  }
  return plan;
}

const Plan& plan_for(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static std::unordered_map<const c10::FunctionSchema*, Plan> plans;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(&op.schema());
  if (it == plans.end()) it = plans.emplace(&op.schema(), make_plan(op)).first;
  return it->second;
}

int64_t queue_min_elements() {
  static const int64_t value = [] {
    const char* v = std::getenv("MYDEV_QUEUE_MIN_ELEMENTS");
    return v != nullptr && *v != '\0' ? std::atoll(v) : int64_t{0};
  }();
  return value;
}

// Which dtypes a CPU kernel supports is only known when it runs, and an
// unsupported one must be reported at the call. Every op in queueable() has
// float and double kernels (and bool ones for masks and conditions, alongside
// floating tensors); other ops verify those too. Kernels for half, bfloat16 and the integer types most have, not
// all: a call with those dtypes (or with only bool tensors) runs at the call
// until one with the same dtype signature has run there without error
// (confirm_queueable_dtypes), and is queued from then on.
bool queueable_dtype(const at::Tensor& t) {
  if (!t.defined()) return true;
  if (t.layout() != c10::kStrided) return false;  // sparse: no Meta kernels to plan with
  const auto d = t.scalar_type();
  return at::isFloatingType(d) || d == at::kBool || at::isIntegralType(d, /*includeBool=*/false);
}

bool verified_dtype(const at::Tensor& t) {
  return !t.defined() || t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble ||
         t.scalar_type() == at::kBool;
}

// The call waiting for its first run at the call to confirm its dtypes, and
// what its Meta kernel said that run would return.
thread_local const Plan* tls_unconfirmed_plan = nullptr;
thread_local std::string tls_unconfirmed_signature;
thread_local std::vector<OutputSpec> tls_unconfirmed_specs;

// Counts the floating tensors in `v` into `floating`; false if any tensor has
// a dtype that is not queueable. An argument named `indices` is int64 by
// definition (max pooling's backward).
bool queueable_dtypes(const c10::IValue& v, const c10::Argument& arg, int& floating) {
  const bool index = arg.name() == "indices";
  auto check = [&](const at::Tensor& t) {
    if (t.defined() && t.is_floating_point()) ++floating;
    if (index && t.defined() && t.layout() == c10::kStrided && t.scalar_type() == at::kLong) return true;
    return queueable_dtype(t);
  };
  if (v.isTensor()) return check(v.toTensor());
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (!check(t)) return false;
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor() && !check(e.toTensor())) return false;
    }
  }
  return true;
}

int64_t elements(const c10::IValue& v) {
  int64_t n = 0;
  if (v.isTensor()) return v.toTensor().defined() ? v.toTensor().numel() : 0;
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) n += t.numel();
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) n += e.isTensor() ? e.toTensor().numel() : 0;
  }
  return n;
}

at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kMyDev) return t;
  at::Tensor m = at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type(), std::nullopt,
                                                std::nullopt, std::nullopt);
  m.unsafeGetTensorImpl()->_set_conj(t.is_conj());
  m.unsafeGetTensorImpl()->_set_neg(t.is_neg());
  return m;
}

template <class T>
void put(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void put_ints(std::string& key, c10::IntArrayRef values) {
  put(key, values.size());
  key.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
}

// What value checks can tell apart: NaN, -inf, negative, zero, positive, +inf.
uint8_t value_class(double x) {
  if (std::isnan(x)) return 0;
  if (std::isinf(x)) return x < 0 ? 1 : 5;
  return x < 0 ? 2 : x == 0 ? 3 : 4;
}

// Appends what the Meta kernel can see of `v` to `key`; false for a kind of
// argument it does not know how to describe (the call is then not cached).
bool put_arg(std::string& key, const c10::IValue& v, bool exact) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    put(key, 'T');
    put(key, t.defined());
    if (!t.defined()) return true;
    put(key, t.device().type());
    put(key, t.scalar_type());  // (not the storage offset: to_meta does not pass it on)
    put(key, static_cast<uint8_t>(t.is_conj() | t.is_neg() << 1 |
                                  t.unsafeGetTensorImpl()->is_wrapped_number() << 2));
    put_ints(key, t.sizes());
    put_ints(key, t.strides());
    return true;
  }
  // (a generator's draws do not change shapes)
  if (v.isNone() || v.isGenerator()) return put(key, 'N'), true;
  if (v.isBool()) return put(key, 'b'), put(key, v.toBool()), true;
  if (v.isInt()) return put(key, 'i'), put(key, v.toInt()), true;
  // Floating values change no output geometry, and change every step in an
  // optimizer (learning-rate schedules, bias corrections): only their class is
  // kept, which is what Meta kernels' value checks look at (a negative beta,
  // an infinite norm order), so those calls stay cached.
  if (v.isDouble()) {
    put(key, 'd');
    return exact ? put(key, v.toDouble()) : put(key, value_class(v.toDouble())), true;
  }
  if (v.isComplexDouble()) return put(key, 'c'), true;
  if (v.isString()) {
    const auto& str = v.toStringRef();
    put(key, 's');
    put(key, str.size());
    key.append(str);
    return true;
  }
  if (v.isDevice()) return put(key, 'D'), put(key, v.toDevice().type()), put(key, v.toDevice().index()), true;
  if (v.isIntList()) return put(key, 'I'), put_ints(key, v.toIntVector()), true;
  if (v.isList()) {
    const auto list = v.toListRef();
    put(key, 'L');
    put(key, list.size());
    for (const c10::IValue& e : list) {
      if (!put_arg(key, e, exact)) return false;
    }
    return true;
  }
  return false;
}

struct Geometry {
  std::vector<int64_t> sizes, strides;
  int64_t offset;
  explicit Geometry(const at::Tensor& t)
      : sizes(t.sizes().vec()), strides(t.strides().vec()), offset(t.storage_offset()) {}
  bool same(const at::Tensor& t) const {
    return t.sizes() == c10::IntArrayRef(sizes) && t.strides() == c10::IntArrayRef(strides) &&
           t.storage_offset() == offset;
  }
};

// Out: whether the caller's outputs can be handed to a queued kernel: strided
// tensors on `device` with the dtypes and sizes the Meta kernel gives.
//  - An empty output (composites such as abs pass one) is resized now, when
//    the result is contiguous, every tensor input is, and none is the output
//    itself (see resizable_with_contiguous_inputs). Otherwise the
//    layout a resized output gets may differ between CPU and Meta kernels
//    (exp.out's Meta kernel makes it contiguous, the CPU one channels-last
//    like the input), so the CPU kernel decides, on the inline path.
//  - A non-empty output of other sizes stays there too, where the CPU kernel
//    resizes it with PyTorch's warning.
//  - So does an output that partly overlaps an input: the Meta kernel sees
//    separate meta tensors, so only the CPU kernel can raise PyTorch's overlap
//    error at the call. (Full overlap, out= self, is what in-place composites
//    pass.)
bool outputs_ready(const std::vector<c10::IValue>& args, const std::vector<size_t>& written,
                   const std::vector<OutputSpec>& specs, c10::DeviceIndex device) {
  // (An output that is also an input, as in the in-place composites, cannot
  // be resized: the CPU's TensorIterator raises, and the Meta kernel, given a
  // separate empty output, cannot know.)
  auto resizable_with_contiguous_inputs = [&](const at::Tensor& out) {
    bool ok = true;
    for (size_t i = 0; i < args.size(); ++i) {
      if (std::find(written.begin(), written.end(), i) != written.end()) continue;
      map_tensors(args[i], [&](const at::Tensor& t) {
        ok = ok && (!t.defined() || (t.is_contiguous() && !t.is_alias_of(out)));
        return t;
      });
    }
    return ok;
  };
  for (size_t k = 0; k < written.size(); ++k) {
    const c10::IValue& v = args[written[k]];
    if (!v.isTensor()) return false;
    at::Tensor out = v.toTensor();
    const OutputSpec& spec = specs[k];
    if (!out.defined() || out.layout() != c10::kStrided || out.device() != c10::Device(kMyDev, device) ||
        out.scalar_type() != spec.dtype) {
      return false;
    }
    // (The specs are those of an empty output: see queue_host_kernel.)
    if (out.sizes() != c10::IntArrayRef(spec.sizes)) {
      const bool contiguous = c10::IntArrayRef(spec.strides) == c10::IntArrayRef(c10::contiguous_strides(spec.sizes));
      if (out.numel() != 0 || !contiguous || !resizable_with_contiguous_inputs(out)) {
        return false;
      }
      out.resize_(spec.sizes);
    }
    for (size_t i = 0; i < args.size(); ++i) {
      // (two outputs sharing memory at all are left to the CPU kernel too)
      const bool output = std::find(written.begin(), written.end(), i) != written.end();
      bool clash = false;
      map_tensors(args[i], [&](const at::Tensor& t) {
        if (t.defined() && !t.is_same(out) && t.device() == out.device()) {
          const auto status = at::get_overlap_status(t, out);
          clash = clash || status == at::MemOverlapStatus::Partial ||
                  (output && status == at::MemOverlapStatus::Full);
        }
        return t;
      });
      if (clash) return false;
    }
  }
  return true;
}

} // namespace

void confirm_queueable_dtypes(const torch::jit::Stack& stack, size_t nreturns) {
  if (tls_unconfirmed_plan == nullptr) return;
  const Plan& plan = *std::exchange(tls_unconfirmed_plan, nullptr);
  const std::vector<OutputSpec>& specs = tls_unconfirmed_specs;
  bool agrees = nreturns == specs.size() && stack.size() >= nreturns;
  // (A functional op's queued out= kernel keeps the layout it is given only
  // where its CPU kernel would choose that layout itself: max_unpool2d makes
  // a channels-last output for a channels-last input, Meta a contiguous one.)
  const bool layout_matters = plan.kind == Kind::Functional;
  for (size_t k = 0; agrees && k < nreturns; ++k) {
    const c10::IValue& r = stack[stack.size() - nreturns + k];
    agrees = r.isTensor() && r.toTensor().sizes() == c10::IntArrayRef(specs[k].sizes) &&
             r.toTensor().scalar_type() == specs[k].dtype &&
             (!layout_matters || r.toTensor().numel() <= 1 || r.toTensor().strides() == c10::IntArrayRef(specs[k].strides));
  }
  if (!agrees) {
    plan.verified->refute();
    return;
  }
  plan.verified->insert(std::move(tls_unconfirmed_signature));
}

std::optional<std::vector<OutputSpec>> meta_outputs(const c10::OperatorHandle& op,
                                                    const std::vector<c10::IValue>& args) {
  const Plan& plan = plan_for(op);
  std::string key;
  bool cacheable = true;
  // (Except for factories whose shape is computed from floating values.)
  const bool exact = op.schema().name() == "aten::arange";
  for (const c10::IValue& v : args) cacheable = cacheable && put_arg(key, v, exact);
  Specs answer;
  if (cacheable && plan.meta_cache->find(key, answer)) return answer;
  torch::jit::Stack meta;
  meta.reserve(args.size());
  for (const c10::IValue& v : args) meta.push_back(map_tensors(v, to_meta));
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception&) {
    return std::nullopt;  // not cached: the error is raised again at every call
  }
  answer.emplace();
  for (const c10::IValue& r : meta) {
    const at::Tensor& m = r.toTensor();
    if (!m.defined()) {
      answer.reset();
      break;
    }
    answer->push_back({m.sizes().vec(), m.strides().vec(), m.scalar_type()});
  }
  if (cacheable) plan.meta_cache->insert(std::move(key), answer);
  return answer;
}

bool queue_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device) {
  tls_unconfirmed_plan = nullptr;  // (an earlier call's run at the call failed)
  const Plan& plan = plan_for(op);
  if (plan.kind == Kind::Inline || plan.verified->refuted()) return false;
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  int floating = 0;
  std::optional<std::string> unconfirmed;  // the dtype signature, if it needs a first run at the call
  for (size_t i = first; i < stack->size(); ++i) {
    if (!queueable_dtypes((*stack)[i], schema.arguments()[i - first], floating)) return false;
  }
  {
    bool unverified = floating == 0 || !plan.floating_known;  // (not every op has bool kernels)
    bool integer = false;
    std::string signature;
    for (size_t i = first; i < stack->size(); ++i) {
      map_tensors((*stack)[i], [&](const at::Tensor& t) {
        unverified = unverified || !verified_dtype(t);
        integer = integer || (t.defined() && at::isIntegralType(t.scalar_type(), /*includeBool=*/false));
        signature.push_back(t.defined() ? static_cast<char>(t.scalar_type()) : '-');
        // (and whether it is contiguous: a CPU kernel may lay its output out
        // after a strided input's, which confirm_queueable_dtypes must see)
        signature.push_back(t.defined() && t.is_contiguous() ? 'c' : 's');
        return t;
      });
    }
    if (integer && floating == 0 && integer_values_checked(schema.name())) return false;
    if (unverified && !plan.verified->contains(signature)) unconfirmed = std::move(signature);
  }
  if (const int64_t min = queue_min_elements(); min > 0) {
    int64_t n = 0;
    for (size_t i = first; i < stack->size(); ++i) n += elements((*stack)[i]);
    if (n < min) return false;
  }

  for (size_t i = first; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isDevice() && v.toDevice().type() == kMyDev) {
      return false;  // factories: their CPU out= kernels would not see the device
    }
  }
  std::vector<c10::IValue> args(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());

  // The Meta kernel (or its cached answer): shapes of the outputs, and every
  // argument error, now. (On an error the inline path reports the CPU
  // kernel's own, or handles the data-dependent case.)
  // An out= call's Meta kernel is given empty outputs of the same dtypes: it
  // then resizes them without PyTorch's warning (given outputs of the wrong
  // shape, it would warn here and the CPU kernel again), and the answer says
  // what shape the outputs must have.
  check_arguments_on_empty_cpu(op, args, plan.kind);
  // (Generators do not shape anything: the Meta kernel gets none.)
  std::vector<c10::IValue> meta_args = args;
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& v = meta_args[i];
    if (v.isGenerator()) meta_args[i] = c10::IValue();
    if (plan.kind != Kind::Out || !writes(schema.arguments()[i]) || !v.isTensor() || !v.toTensor().defined()) {
      continue;
    }
    meta_args[i] = at::detail::empty_meta({0}, v.toTensor().scalar_type(), std::nullopt, std::nullopt, std::nullopt,
                                          std::nullopt);
  }
  Specs answer = meta_outputs(op, meta_args);
  if (!answer || !fix_specs(schema, args, *answer)) return false;
  const std::vector<OutputSpec>& specs = *answer;
  if (unconfirmed) {
    // Runs at the call; confirm_queueable_dtypes checks its outputs against specs.
    tls_unconfirmed_plan = &plan;
    tls_unconfirmed_signature = std::move(*unconfirmed);
    tls_unconfirmed_specs = specs;
    return false;
  }

  std::vector<at::Tensor> outputs;
  if (plan.kind == Kind::Functional || plan.kind == Kind::FunctionalCopy) {
    outputs.reserve(specs.size());
    for (const OutputSpec& spec : specs) {
      outputs.push_back(empty_device(spec.sizes, spec.strides, at::TensorOptions(spec.dtype).device(kMyDev, device)));
    }
  }
  const at::Tensor self = plan.kind == Kind::InPlace ? args[0].toTensor() : at::Tensor();
  if (plan.kind == Kind::InPlace &&
      !(self.sizes() == c10::IntArrayRef(specs[0].sizes) && self.strides() == c10::IntArrayRef(specs[0].strides))) {
    return false;  // an in-place op that restrides self: keep that on the calling thread
  }
  std::vector<size_t> written;  // Out: the outputs' places among the arguments
  if (plan.kind == Kind::Out) {
    for (size_t i = 0; i < nargs; ++i) {
      if (writes(schema.arguments()[i])) written.push_back(i);
    }
    if (!outputs_ready(args, written, specs, device)) return false;
    for (size_t i : written) outputs.push_back(args[i].toTensor());
  }

  // Random ops draw their CPU engine now, once nothing can send the call to
  // the inline path (which draws its own), so the stream of numbers follows
  // launch order, as with inline host kernels.
  for (size_t i = 0; i < nargs; ++i) args[i] = host_generator(args[i], schema.arguments()[i], device);

  struct Job {
    const Plan* plan;
    c10::OperatorHandle op;
    std::vector<c10::IValue> args;
    std::vector<at::Tensor> outputs;
    c10::DeviceIndex device;
  };
  // The kernel works on the inputs as they are now: a caller that restrides
  // one afterwards (resize_, t_, as_strided_; soft_margin_loss's composite
  // out= resizes its output between two queued kernels) must not change what
  // an already-launched kernel reads, as it would not on a GPU. So the job
  // has TensorImpls of its own, over leases where it can (KernelArgs.h).
  KernelArgs held(device);
  for (c10::IValue& v : args) v = map_tensors(v, [&](const at::Tensor& t) { return held.own(t); });
  std::vector<at::Tensor> job_outputs;
  job_outputs.reserve(outputs.size());
  if (plan.kind == Kind::Out) {
    for (size_t i : written) job_outputs.push_back(args[i].toTensor());  // (already the job's own)
  } else {
    for (const at::Tensor& out : outputs) job_outputs.push_back(held.own(out));
  }
  auto job = std::make_unique<Job>(Job{&plan, op, std::move(args), std::move(job_outputs), device});

  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  if (plan.kind == Kind::InPlace) {
    stack->push_back(self);
  } else {
    for (at::Tensor& out : outputs) stack->push_back(std::move(out));
  }

  launch_async(device, plan.label.c_str(), [job = std::move(job)] {
    HostCall call(job->device);
    auto host = [&](const at::Tensor& t) { return call.to_host(t); };
    torch::jit::Stack host_stack;
    host_stack.reserve(job->args.size() + job->outputs.size());
    for (const c10::IValue& v : job->args) host_stack.push_back(map_tensors(v, host));
    std::vector<Geometry> expected;
    if (job->plan->kind == Kind::Functional) {
      for (const at::Tensor& out : job->outputs) {
        expected.emplace_back(out);
        host_stack.push_back(call.to_host(out));
      }
      job->plan->out_op->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &host_stack);
    } else if (job->plan->kind == Kind::FunctionalCopy) {
      job->op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &host_stack);
      // Outputs in the Meta kernel's layout: the copy takes any other, but the
      // sizes must agree, as the caller already holds the outputs.
      for (size_t i = 0; i < job->outputs.size(); ++i) {
        const at::Tensor& r = host_stack[i].toTensor();
        TORCH_CHECK(r.sizes() == job->outputs[i].sizes() && r.scalar_type() == job->outputs[i].scalar_type(),
                    "the CPU kernel gave output ", i, " sizes ", r.sizes(), " and dtype ", r.scalar_type(),
                    ", the Meta kernel ", job->outputs[i].sizes(), " and ", job->outputs[i].scalar_type());
        call.to_host(job->outputs[i]).copy_(r);
      }
      return;
    } else if (job->plan->kind == Kind::Out) {
      for (const at::Tensor& out : job->outputs) expected.emplace_back(out);
      job->op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &host_stack);
    } else {
      const at::Tensor& self = job->args[0].toTensor();
      expected.emplace_back(self);
      job->op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &host_stack);
    }
    // The Meta kernel promised these geometries; the caller already holds the
    // tensors, so a CPU kernel that disagreed would be a bug to report, not to fix up.
    for (size_t i = 0; i < expected.size(); ++i) {
      const at::Tensor& r = host_stack[i].toTensor();
      TORCH_CHECK(expected[i].same(r), "the CPU kernel gave output ", i, " a different shape or strides (",
                  r.sizes(), ", ", r.strides(), ") than the Meta kernel (", c10::IntArrayRef(expected[i].sizes),
                  ", ", c10::IntArrayRef(expected[i].strides), ")");
    }
    call.copy_back_reallocated();
  });
  return true;
}

} // namespace my_device
