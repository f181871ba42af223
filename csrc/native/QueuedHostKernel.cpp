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
// Ops outside the families listed in queueable(), ops without a Meta kernel or
// out= overload, and calls whose Meta kernel fails stay on the inline path,
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

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

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
// InPlace: `self_` written and returned.
enum class Kind { Inline, Functional, InPlace };

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

// Dtype signatures (the scalar types of a call's tensors, in order) whose CPU
// kernel is known to exist: see queueable_dtype.
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

 private:
  std::mutex mu_;
  std::unordered_set<std::string> set_;
};

struct Plan {
  Kind kind = Kind::Inline;
  std::optional<c10::OperatorHandle> out_op;  // Functional: the out= overload
  std::string label;                          // "aten::name.overload", for failure reports
  std::unique_ptr<MetaCache> meta_cache = std::make_unique<MetaCache>();
  std::unique_ptr<VerifiedDtypes> verified = std::make_unique<VerifiedDtypes>();
};

// The ops that may be queued, by base name: families whose output shapes
// follow from the input shapes and whose CPU kernels never reject the data.
// Indexing, gathers and scatters, losses with class targets, random sampling
// and linear algebra validate values (an index out of range) and raise; on the
// inline path that error comes at the call, as on the CPU, instead of at a
// later synchronisation, as a GPU's device-side assert would.
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
             "floor", "ceil", "round", "trunc", "frac", "reciprocal", "nan_to_num", "where",
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
             // max pooling (its backward takes int64 `indices`); batch norm in training
             // mode (see agrees_with_cpu). (The optimizers' _foreach_ ops need no entry:
             // they have no CPU kernel, and decompose into per-tensor ops queued here.)
             "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "native_batch_norm",
             // filling and shaping copies
             "fill", "zero", "tril", "triu", "flip", "roll"}) {
      n.insert(std::string("aten::") + base);
    }
    return n;
  }();
  return names;
}

// Calls the queued path would get wrong, for native_batch_norm:
//  - in eval mode the CPU kernel returns empty save_mean/save_invstd, but the
//    Meta kernel shapes them like the channels;
//  - the CPU out= kernel (torch 2.13) computes wrong values for an input that
//    is not contiguous in some memory format, where the functional one does
//    not. test_async.py::test_cpu_batch_norm_out_still_mishandles_strided_input
//    notices when PyTorch fixes that.
bool agrees_with_cpu(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first) {
  if (schema.name() != "aten::native_batch_norm") return true;
  const auto training = schema.argumentIndexWithName("training");
  const at::Tensor& input = stack[first].toTensor();
  // (in half and bfloat16 the out= kernel rejects the float statistics it is given)
  if (input.scalar_type() != at::kFloat && input.scalar_type() != at::kDouble) return false;
  // (and the Meta decomposition promotes mixed dtypes, which the CPU kernel rejects)
  for (size_t i = 1; i <= 4; ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() != input.scalar_type()) return false;
  }
  return training && stack[first + *training].toBool() &&
         (input.is_contiguous() || input.is_contiguous(at::MemoryFormat::ChannelsLast) ||
          input.is_contiguous(at::MemoryFormat::ChannelsLast3d));
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
  if (!queueable().count(base) || !op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) {
    return plan;
  }
  const auto& args = schema.arguments();
  size_t written = 0;
  for (const auto& a : args) written += writes(a) ? 1 : 0;
  if (schema.returns().empty()) return plan;
  for (const auto& r : schema.returns()) {
    if (!is_plain_tensor(r.type())) return plan;
  }
  if (written == 0) {
    for (const auto& r : schema.returns()) {
      if (r.alias_info() != nullptr) return plan;  // a view
    }
    plan.out_op = find_out_overload(schema);
    if (plan.out_op) plan.kind = Kind::Functional;
  } else if (written == 1 && writes(args[0]) && !args[0].kwarg_only() && schema.returns().size() == 1 &&
             schema.returns()[0].alias_info() != nullptr && schema.name().back() == '_') {
    plan.kind = Kind::InPlace;
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
// float and double kernels (bool for masks and conditions). Half and
// bfloat16 kernels most have, not all: a call in those dtypes runs at the call
// until one with the same dtype signature has run there without error
// (confirm_queueable_dtypes), and is queued from then on.
bool queueable_dtype(const at::Tensor& t) {
  if (!t.defined()) return true;
  if (t.layout() != c10::kStrided) return false;  // sparse: no Meta kernels to plan with
  const auto d = t.scalar_type();
  return d == at::kFloat || d == at::kDouble || d == at::kBool || d == at::kHalf || d == at::kBFloat16;
}

bool reduced_precision(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
}

// The call waiting for its first run at the call to confirm its dtypes.
thread_local const Plan* tls_unconfirmed_plan = nullptr;
thread_local std::string tls_unconfirmed_signature;

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
bool put_arg(std::string& key, const c10::IValue& v) {
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
  if (v.isDouble()) return put(key, 'd'), put(key, value_class(v.toDouble())), true;
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
      if (!put_arg(key, e)) return false;
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

} // namespace

void confirm_queueable_dtypes() {
  if (tls_unconfirmed_plan == nullptr) return;
  tls_unconfirmed_plan->verified->insert(std::move(tls_unconfirmed_signature));
  tls_unconfirmed_plan = nullptr;
}

std::optional<std::vector<OutputSpec>> meta_outputs(const c10::OperatorHandle& op,
                                                    const std::vector<c10::IValue>& args) {
  const Plan& plan = plan_for(op);
  std::string key;
  bool cacheable = true;
  for (const c10::IValue& v : args) cacheable = cacheable && put_arg(key, v);
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
  if (plan.kind == Kind::Inline) return false;
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  int floating = 0;
  for (size_t i = first; i < stack->size(); ++i) {
    if (!queueable_dtypes((*stack)[i], schema.arguments()[i - first], floating)) return false;
  }
  if (floating == 0) return false;  // all bool: not every op has bool kernels
  {
    bool reduced = false;
    std::string signature;
    for (size_t i = first; i < stack->size(); ++i) {
      map_tensors((*stack)[i], [&](const at::Tensor& t) {
        reduced = reduced || reduced_precision(t);
        signature.push_back(t.defined() ? static_cast<char>(t.scalar_type()) : '-');
        return t;
      });
    }
    if (reduced && !plan.verified->contains(signature)) {
      tls_unconfirmed_plan = &plan;
      tls_unconfirmed_signature = std::move(signature);
      return false;
    }
  }
  if (!agrees_with_cpu(schema, *stack, first)) return false;
  if (const int64_t min = queue_min_elements(); min > 0) {
    int64_t n = 0;
    for (size_t i = first; i < stack->size(); ++i) n += elements((*stack)[i]);
    if (n < min) return false;
  }

  // Random ops draw their CPU engine now, so the stream of numbers follows
  // launch order, as with inline host kernels.
  for (size_t i = first; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isDevice() && v.toDevice().type() == kMyDev) {
      return false;  // factories: their CPU out= kernels would not see the device
    }
  }
  std::vector<c10::IValue> args;
  args.reserve(nargs);
  for (size_t i = 0; i < nargs; ++i) {
    args.push_back(host_generator((*stack)[first + i], schema.arguments()[i], device));
  }

  // The Meta kernel (or its cached answer): shapes of the outputs, and every
  // argument error, now. (On an error the inline path reports the CPU
  // kernel's own, or handles the data-dependent case.)
  const Specs answer = meta_outputs(op, args);
  if (!answer) return false;
  const std::vector<OutputSpec>& specs = *answer;

  std::vector<at::Tensor> outputs;
  if (plan.kind == Kind::Functional) {
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
  for (const at::Tensor& out : outputs) job_outputs.push_back(held.own(out));
  auto job = std::make_unique<Job>(Job{&plan, op, std::move(args), std::move(job_outputs), device});

  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  if (plan.kind == Kind::Functional) {
    for (at::Tensor& out : outputs) stack->push_back(std::move(out));
  } else {
    stack->push_back(self);
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
