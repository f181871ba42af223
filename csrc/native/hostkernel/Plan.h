#pragma once
// What the host kernel may do with an op, decided once per operator overload
// from its schema and name (make_plan), with everything the per-call path
// would otherwise work out again on every call.
//
// A CPU kernel decides its output shapes while it runs, which is why host
// kernels normally run at the call (launch_inline). But most ops have a Meta
// kernel that computes exactly those shapes without touching data, and an
// out= overload. For them the call is split, as a GPU backend splits it:
//   now (host):   device checks, the Meta kernel (shape, dtype and argument
//                 errors are raised here, at the call, not at a later sync),
//                 allocation of the outputs on the device;
//   later (worker): the CPU out= kernel (or in-place kernel) on host aliases of
//                 the device memory, writing into those outputs.
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "MetaCache.h"

namespace my_device {

// Inline: runs at the call, in stream order (HostKernel.cpp).
// Functional: outputs allocated at the call, the out= overload queued.
// FunctionalCopy: the same for ops whose out= overload has no CPU kernel
// (PyTorch generates it: layer norm, relu, flip, ...): the functional CPU
// kernel is queued and its results copied into the outputs.
// InPlace: `self_` written and returned.
// Out: an out= overload called directly, by the user or by a composite kernel
// (mul_.Scalar is mul.out into self; composites reach it): the caller's
// outputs are written and returned.
// InPlaceList: an in-place foreach op (`_foreach_lerp_`), which writes its
// first list and returns nothing: one queued kernel for the whole list, where
// its composite kernel would launch one per tensor.
enum class Kind { Inline, Functional, FunctionalCopy, InPlace, Out, InPlaceList };

// Facts about one argument of the schema.
struct ArgFacts {
  bool written = false;    // an out= or in-place target
  bool generator = false;  // a Generator or Generator?
  bool indices = false;    // named `indices`: int64 by definition (max pooling's backward)
};

struct Plan {
  Kind kind = Kind::Inline;
  std::string label;                          // "aten::name.overload", for failure reports
  std::optional<c10::OperatorHandle> out_op;  // Functional: the out= overload
  std::vector<ArgFacts> args;
  std::vector<size_t> written;  // Out: the outputs' places among the arguments
  // Integer kernels that raise on values (division by zero): integer-only calls stay at the call.
  bool integer_values_checked = false;
  // The CPU kernel checks scalar arguments that the Meta kernel does not
  // (check_arguments_on_empty_cpu): such calls are checked once per exact set of values.
  bool scalar_checks = false;
  bool has_generator = false;
  // The op's output shapes may depend on the data (Plan.cpp's shape_from_data):
  // a signature is queued only if the Meta kernel can shape it without the
  // data (index.Tensor with integer indices, not with a mask).
  bool shape_from_data = false;
  // Floating arguments shape the outputs (arange): the Meta cache keys on their exact values.
  bool exact_key = false;
  // Each sample of the batch (the first dimension of every tensor argument and
  // output) is computed on its own (attention, forward and backward): a queued
  // call big enough runs in blocks of samples shared among the compute units.
  bool by_samples = false;
  // An elementwise op the CPU runs through oneDNN (gelu and its backward): a queued call over contiguous
  // operands of one shape big enough runs in blocks of elements shared among the compute units.
  bool by_elements = false;
  // Signatures, their Meta answers and whether the CPU kernel confirmed them
  // (see Signature).
  MetaCache meta_cache;
  // A run at the call gave outputs of other sizes, dtypes or layouts than the
  // Meta kernel's answer: its Meta kernel cannot be trusted to shape the
  // outputs a queued call hands out at once, so the op is never queued again.
  mutable std::atomic<bool> refuted{false};
  // Exact keys of calls whose scalar checks passed (see scalar_checks).
  mutable std::mutex checked_mu;
  mutable std::unordered_set<std::string> checked;
};

// The op's plan, made on its first call. Plans live as long as the process.
const Plan& plan_for(const c10::OperatorHandle& op);

// Whether an op's first list argument, written, is all it returns: the
// in-place foreach ops that Registration.cpp registers the host kernel for.
bool is_in_place_list_op(const c10::FunctionSchema& schema);

} // namespace my_device
