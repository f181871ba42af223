// Plans (Plan.h): what the host kernel may do with each op, decided from its
// schema and name on the op's first call.
#include "Plan.h"

#include <ATen/core/enum_tag.h>

#include <algorithm>
#include <memory>
#include <unordered_map>

#include "HostCall.h"

namespace my_device {
namespace {

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

// Every op with a Meta kernel may be queued, except those below (may_queue)
// and those whose output shapes depend on the data (shape_from_data); a call
// is queued only once a call of its exact signature ran at the call
// (Signature, MetaCache.h), and its outputs are shaped as that run's were.
// That includes indexing, gathers and scatters and the class-target losses,
// whose CPU kernels reject an index out of range: as a GPU's device-side
// assert, that error is reported at the next synchronisation, naming the op
// (and the device stays usable). Run at the call instead, they made the host
// wait for the stream on every call (twice a training step, for the loss),
// where CUDA does not.
//
// Some ops stay at the call because the conformance sweep found them wrong
// queued when answers came from Meta kernels: masked_scatter_ (Meta accepted
// a mask that does not broadcast), _embedding_bag* (offset2bag and bag_size
// sized unlike the CPU's), triangular_solve and ormqr (out= outputs laid out
// column-major). Answers now come from the CPU's own run, which may have made
// them safe; they stay here until a sweep shows it.
bool may_queue(const std::string& base) {
  static const std::unordered_set<std::string> meta_disagrees = {
      "aten::masked_scatter", "aten::_embedding_bag", "aten::_embedding_bag_forward_only",
      "aten::triangular_solve", "aten::ormqr"};
  return !checks_lapack_info(base) && !meta_disagrees.count(base);
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

// Ops whose output shapes may depend on the data (nonzero, masked_select,
// unique, boolean indexing, repeat_interleave without output_size), or whose
// results are read from it (item, equal), as PyTorch tags them for FakeTensor.
// A tag on any overload counts for all of the name's (index.Tensor is tagged,
// index.Tensor_out is not).
bool shape_from_data(const std::string& name) {
  static const std::unordered_set<std::string> names = [] {
    std::unordered_set<std::string> tagged;
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const auto& op_name : dispatcher.getAllOpNames()) {
      auto handle = dispatcher.findOp(op_name);
      if (handle && handle->hasSchema() &&
          (handle->hasTag(at::Tag::dynamic_output_shape) || handle->hasTag(at::Tag::data_dependent_output))) {
        tagged.insert(op_name.name);
      }
    }
    return tagged;
  }();
  return names.count(name) > 0;
}

// Decides plan.kind; the other fields are filled in by make_plan.
void choose_kind(const c10::OperatorHandle& op, Plan& plan) {
  const auto& schema = op.schema();
  std::string base = schema.name();
  if (base.size() > 1 && base.back() == '_' && base[base.size() - 2] != '_') base.pop_back();
  if (!may_queue(base)) return;
  if (is_in_place_list_op(schema)) {
    // No Meta kernel of its own: its composite kernel, run on Meta tensors,
    // makes the per-tensor checks.
    plan.kind = Kind::InPlaceList;
    return;
  }
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) return;
  const auto& args = schema.arguments();
  size_t written = 0;
  for (const auto& a : args) written += writes(a) ? 1 : 0;
  if (schema.returns().empty()) return;
  for (const auto& r : schema.returns()) {
    if (!is_plain_tensor(r.type())) return;
  }
  if (checks_tensor_values(schema)) return;
  if (written == 0) {
    for (const auto& r : schema.returns()) {
      if (r.alias_info() != nullptr) return;  // a view
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
        return;
      }
    }
    if (!avoid_out_kernel(schema.name())) plan.kind = Kind::Out;
  }
}

std::unique_ptr<Plan> make_plan(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  auto plan = std::make_unique<Plan>();
  plan->label = schema.overload_name().empty() ? schema.name() : schema.name() + "." + schema.overload_name();
  choose_kind(op, *plan);
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::Argument& a = schema.arguments()[i];
    ArgFacts facts;
    facts.written = writes(a);
    facts.generator = is_optional_generator(a);
    facts.indices = a.name() == "indices";
    plan->has_generator = plan->has_generator || facts.generator;
    if (plan->kind == Kind::Out && facts.written) plan->written.push_back(i);
    plan->args.push_back(facts);
  }
  plan->integer_values_checked = integer_values_checked(schema.name());
  plan->scalar_checks = has_scalar_checks(schema) || (plan->kind == Kind::InPlace && plan->has_generator);
  plan->exact_key = schema.name() == "aten::arange";
  plan->by_samples = plan->kind == Kind::FunctionalCopy &&
                     (schema.name() == "aten::_scaled_dot_product_flash_attention_for_cpu" ||
                      schema.name() == "aten::_scaled_dot_product_flash_attention_for_cpu_backward");
  plan->by_elements = plan->kind == Kind::Functional &&
                      (schema.name() == "aten::gelu" || schema.name() == "aten::gelu_backward");
  plan->shape_from_data = shape_from_data(schema.name());
  return plan;
}

} // namespace

bool is_in_place_list_op(const c10::FunctionSchema& schema) {
  const auto& args = schema.arguments();
  if (schema.name().rfind("aten::_foreach_", 0) != 0 || !schema.returns().empty() || args.empty()) return false;
  // Every tensor argument a list: a lone Tensor (a CPU tensor of scalars in
  // some overloads) would not follow the lists' device. _foreach_copy_ may
  // copy between devices.
  if (schema.name() == "aten::_foreach_copy_") return false;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::TypePtr& type = args[i].type();
    const bool list = type->kind() == c10::TypeKind::ListType &&
                      type->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType;
    if (i == 0 ? !(list && writes(args[i])) : writes(args[i])) return false;
    if (!list && (type->kind() == c10::TypeKind::TensorType || type->kind() == c10::TypeKind::OptionalType ||
                  type->kind() == c10::TypeKind::ListType)) {
      // (Scalar[] lists are fine; a Tensor, Tensor? or Tensor?[] is not)
      if (type->kind() != c10::TypeKind::ListType ||
          type->castRaw<c10::ListType>()->getElementType()->kind() != c10::TypeKind::NumberType) {
        return false;
      }
    }
  }
  return true;
}

const Plan& plan_for(const c10::OperatorHandle& op) {
  // Asked once or more per host-kernel call: each thread keeps the plans it
  // has used, and only a thread's first call of an op takes the lock.
  thread_local std::unordered_map<const c10::FunctionSchema*, const Plan*> seen;
  const c10::FunctionSchema* key = &op.schema();
  auto hit = seen.find(key);
  if (hit != seen.end()) return *hit->second;
  static std::mutex mutex;
  static std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<Plan>> plans;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(op)).first;
  seen.emplace(key, it->second.get());
  return *it->second;
}

} // namespace my_device
