// Host kernels queued on the stream instead of run at the call (Plan.h says
// which calls may be, and how they are split).
//
// Eligible calls are queued at any size. Queueing small calls costs about a
// microsecond more per op than running them at the call, but every op run at
// the call first waits for the stream's queue to drain, so mixing the two
// costs more: the demo's training step measured 1.26-1.59x CPU with calls
// under 2^18 elements at the call, 0.98-1.02x with all queued.
// MYDEV_QUEUE_MIN_ELEMENTS (the elements of all tensor arguments together)
// sets a size below which calls run at the call instead.
//
// The per-call path is what every small op pays, so what can be decided once
// per op is in its Plan, a call's signature is built into a reused buffer,
// and the Meta cache hands out its answer without copying it.
#include "QueuedHostKernel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <utility>

#include "Breakdown.h"
#include "HostCall.h"
#include "MetaCache.h"
#include "Plan.h"
#include "core/ComputeUnits.h"
#include "core/KernelArgs.h"
#include "core/Launch.h"
#include "core/TensorImpl.h"
#include "native/Factory.h"

namespace my_device {
namespace {

int64_t queue_min_elements() {
  static const int64_t value = [] {
    const char* v = std::getenv("MYDEV_QUEUE_MIN_ELEMENTS");
    return v != nullptr && *v != '\0' ? std::atoll(v) : int64_t{0};
  }();
  return value;
}

// Strided tensors of floating, bool and integer dtypes (sparse ones have no
// Meta kernels to plan with).
bool queueable_dtype(const at::Tensor& t) {
  if (!t.defined()) return true;
  if (t.layout() != c10::kStrided) return false;
  const auto d = t.scalar_type();
  return at::isFloatingType(d) || d == at::kBool || at::isIntegralType(d, /*includeBool=*/false);
}

int64_t elements(const c10::IValue& v) {
  int64_t n = 0;
  for_each_tensor(v, [&](const at::Tensor& t) { n += t.defined() ? t.numel() : 0; });
  return n;
}

// What a call's tensors say about its dtypes.
struct DtypeScan {
  bool queueable = true;   // every tensor's dtype and layout can be queued
  int floating = 0;        // floating tensors
  bool integer = false;    // some integer tensor

  void add(const c10::IValue& v, const ArgFacts& facts) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      const at::ScalarType d = t.scalar_type();
      if (at::isFloatingType(d)) ++floating;
      integer = integer || at::isIntegralType(d, /*includeBool=*/false);
      if (facts.indices && t.layout() == c10::kStrided && d == at::kLong) return;
      queueable = queueable && queueable_dtype(t);
    });
  }
};

// How each written tensor overlaps the call's other tensors: the CPU kernel
// checks it (assert_no_overlap, assert_no_partial_overlap), and sizes and
// strides alone do not tell it, since two arguments may share memory.
void add_overlaps(CallKey& key, const Plan& plan, const c10::IValue* args) {
  for (size_t w = 0; w < plan.args.size(); ++w) {
    if (!plan.args[w].written || !args[w].isTensor() || !args[w].toTensor().defined()) continue;
    const at::Tensor& out = args[w].toTensor();
    for (size_t i = 0; i < plan.args.size(); ++i) {
      if (i == w) continue;
      for_each_tensor(args[i], [&](const at::Tensor& t) {
        const bool shared = t.defined() && t.has_storage() && out.has_storage() && t.is_alias_of(out);
        key.add_byte(shared ? static_cast<uint8_t>(at::get_overlap_status(out, t)) : uint8_t{0xff});
      });
    }
  }
}


// Scalar arguments are checked by CPU kernels that Meta kernels do not all
// repeat: the random in-place ops' parameters (uniform_'s range, random_'s
// bounds, bernoulli_'s p), and, in pointwise ops, whether a number fits the
// tensors' dtype (fill_(1e300) on float, masked_fill of 1e30 into int64).
// Running the CPU kernel on empty tensors of the arguments' dtypes, with a
// generator of its own, makes those checks without computing or drawing
// anything, and raises the CPU's error here, at the call, as CUDA checks a
// scalar on the host before launching. Before the device's generator is drawn
// from, so a failed call leaves its stream of numbers as it was. A set of
// values that passed is not checked again. False if the check warned: the
// call then runs at the call.
bool arguments_pass_on_empty_cpu(const c10::OperatorHandle& op, const Plan& plan, const c10::IValue* args,
                                 CallKey& key) {
  if (!plan.scalar_checks) return true;
  // (A copy: the CPU kernel may run Python, whose finalisers may launch mydev
  // ops on this thread and reuse its key buffer.)
  std::string exact = key.exact();
  {
    std::lock_guard<std::mutex> lock(plan.checked_mu);
    if (plan.checked.count(exact)) return true;
  }
  static const at::Generator scratch = at::make_generator<at::CPUGeneratorImpl>();
  torch::jit::Stack stack;
  for (size_t i = 0; i < plan.args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor() && v.toTensor().defined()) {
      stack.push_back(at::empty({0}, at::TensorOptions(v.toTensor().scalar_type())));
    } else if (plan.args[i].generator) {
      stack.push_back(scratch);
    } else {
      stack.push_back(v);
    }
  }
  {
    // A warning (random_'s bound that a float cannot hold exactly) keeps the
    // call at the call, where the CPU kernel gives it once, at the caller.
    WarningWatch watch(/*forward=*/false);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
    if (watch.warned()) return false;
  }
  std::lock_guard<std::mutex> lock(plan.checked_mu);
  if (plan.checked.size() >= 512) plan.checked.clear();  // values that keep changing: start over
  plan.checked.insert(std::move(exact));
  return true;
}

// Whether `op`'s Meta kernel shapes the call without raising. An out= call's
// Meta kernel is given empty outputs of the same dtypes (given outputs of the
// wrong shape, it would warn).
bool meta_shapes(const c10::OperatorHandle& op, const Plan& plan, const c10::IValue* args) {
  std::vector<c10::IValue> meta_args(args, args + plan.args.size());
  for (size_t i = 0; i < meta_args.size(); ++i) {
    c10::IValue& v = meta_args[i];
    // (Generators do not shape anything: the Meta kernel gets none.)
    if (v.isGenerator()) v = c10::IValue();
    if (plan.kind == Kind::Out && plan.args[i].written && v.isTensor() && v.toTensor().defined()) {
      v = at::detail::empty_meta({0}, v.toTensor().scalar_type(), std::nullopt, std::nullopt, std::nullopt,
                                 std::nullopt);
    }
  }
  return run_meta(op, meta_args).has_value();
}

// The call's signature, if a call of it has run before; null for a new one
// (but for an in-place op, whose answer is self as it is: one that restrides
// self is refuted by confirm_signature).
//
// Answers come from the CPU kernel's own first run of the signature, not from
// the op's Meta kernel: that run has to happen anyway for the CPU kernel's
// checks, its outputs are the truth that Meta kernels only approximate (their
// layouts and dtypes differ for several ops), and most of torch 2.13's Meta
// kernels are Python references whose first run imports torch._dynamo and
// sympy, seconds for a process's first torch.randn or trunc_normal_. What
// makes one run's answer hold for every call of the signature is that the
// op's output shapes do not depend on the data: for ops that PyTorch tags as
// having such shapes (Plan::shape_from_data), only signatures that the Meta
// kernel shapes without raising (it raises where the data would decide).
std::shared_ptr<const Signature> signature_for(const c10::OperatorHandle& op, const Plan& plan,
                                               const c10::IValue* args, const CallKey& key) {
  if (std::shared_ptr<const Signature> known = plan.meta_cache.find(key.shape())) return known;
  if (plan.shape_from_data && !meta_shapes(op, plan, args)) {
    return plan.meta_cache.insert(key.shape(), std::nullopt);  // stays at the call
  }
  if (plan.kind != Kind::InPlace) return nullptr;
  const at::Tensor& self = args[0].toTensor();
  return plan.meta_cache.insert(key.shape(), Answer(Specs{{self.sizes().vec(), self.strides().vec(),
                                                            self.scalar_type()}}));
}

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
bool outputs_ready(c10::ArrayRef<c10::IValue> args, const std::vector<size_t>& written, const Specs& specs,
                   c10::DeviceIndex device) {
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

// A by_samples call's batch: the first dimension of its outputs and of its
// batched tensor arguments (one of 1 broadcasts to every sample); 0 where they differ,
// or where the call draws random numbers (dropout), which a cut would draw in
// another order.
int64_t batch_of(const c10::FunctionSchema& schema, const torch::jit::Stack& args,
                 const std::vector<at::Tensor>& outputs) {
  if (outputs.empty() || outputs[0].dim() == 0) return 0;
  for (size_t i = 0; i < args.size() && i < schema.arguments().size(); ++i) {
    if (schema.arguments()[i].name() == "dropout_p" && args[i].isDouble() && args[i].toDouble() != 0.0) return 0;
  }
  const int64_t batch = outputs[0].size(0);
  for (const at::Tensor& out : outputs) {
    if (out.dim() == 0 || out.size(0) != batch) return 0;
  }
  // Tensors of three dimensions or more have the batch first (queries, keys, values, results, log-sum-exps, a
  // 4-D mask) or 1; a 2-D mask, (queries, keys), broadcasts over the batch and is never cut; a call with a
  // tensor of fewer dimensions is not cut at all. An absent mask may come as an undefined tensor, not None
  // (autograd's call of the backward passes the forward's saved one so).
  for (const c10::IValue& v : args) {
    if (v.isTensor() && !v.toTensor().defined()) continue;
    if (v.isTensor() && v.toTensor().dim() >= 3 && v.toTensor().size(0) != batch && v.toTensor().size(0) != 1) {
      return 0;
    }
    if (v.isTensor() && v.toTensor().dim() < 2) return 0;
  }
  return batch;
}

// Attention's multiply-adds, about: each query row meets every key row twice
// (scores, then values) over the head size. (The backward's first two
// arguments are the output's gradient and the query, both shaped as the query.)
int attention_parts(const torch::jit::Stack& args, int64_t samples) {
  const at::Tensor& query = args[0].toTensor();
  const int64_t keys = args[1].toTensor().dim() >= 2 ? args[1].toTensor().size(-2) : 1;
  return block_count(samples, 1, 2 * query.numel() * keys, kMinMultiplyAddsPerBlock);
}

// A by_elements call's blocks: two where every tensor (arguments, then outputs) is contiguous with the first
// output's elements, and they are enough for two; else one.
int element_parts(const torch::jit::Stack& stack, const at::Tensor& out) {
  const int64_t n = out.numel();
  for (const c10::IValue& v : stack) {
    if (v.isTensor() && (v.toTensor().numel() != n || !v.toTensor().is_contiguous())) return 1;
  }
  return block_count(n, kMinElementwisePerBlock, n, kMinElementwisePerBlock);
}

// The queued kernel: the CPU kernel on host aliases of its own references to
// the arguments and outputs.
struct QueuedCall {
  const Plan* plan;
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;
  std::vector<at::Tensor> outputs;
  c10::DeviceIndex device;
  bool grad_mode;  // the caller's, which a few CPU kernels read (see CallKey::add_settings)

  void run() {
    c10::AutoGradMode caller_grad_mode(grad_mode);
    HostCall call(device);
    auto host = [&](const at::Tensor& t) { return call.to_host(t); };
    torch::jit::Stack stack;
    stack.reserve(args.size() + outputs.size());
    for (const c10::IValue& v : args) stack.push_back(map_tensors(v, host));
    const c10::DispatchKeySet cpu(c10::DispatchKey::CPU);
    switch (plan->kind) {
      case Kind::Functional: {
        for (const at::Tensor& out : outputs) stack.push_back(call.to_host(out));
        const int parts = plan->by_elements && blocks_split() ? element_parts(stack, outputs[0]) : 1;
        if (parts < 2) {
          plan->out_op->redispatchBoxed(cpu, &stack);
          check_geometry(stack, outputs);
          break;
        }
        // Blocks of elements that start where a vector loop's step does: each element takes the code it takes
        // in one call.
        const int64_t n = outputs[0].numel();
        run_blocks(parts, parts, [&](int64_t first, int64_t count) {
          for (int64_t p = first; p < first + count; ++p) {
            const int64_t lo = block_start(n, p, parts, kVectorLoopStep);
            torch::jit::Stack cut = stack;
            for (c10::IValue& v : cut) {
              if (v.isTensor()) v = v.toTensor().view(-1).narrow(0, lo, block_start(n, p + 1, parts, kVectorLoopStep) - lo);
            }
            plan->out_op->redispatchBoxed(cpu, &cut);
          }
        });
        break;
      }
      case Kind::FunctionalCopy: {
        std::vector<at::Tensor> host_outputs;
        for (const at::Tensor& out : outputs) host_outputs.push_back(call.to_host(out));
        const int64_t samples = plan->by_samples ? batch_of(op.schema(), stack, outputs) : 0;
        run_blocks(samples, samples > 1 ? attention_parts(stack, samples) : 1, [&](int64_t lo, int64_t n) {
          // (A call run whole, as nearly every one is, uses the stack as it is: no copy of its arguments.)
          torch::jit::Stack cut;
          if (n != samples) {
            cut = stack;
            for (c10::IValue& v : cut) {
              if (v.isTensor() && v.toTensor().defined() && v.toTensor().dim() >= 3 && v.toTensor().size(0) == samples) {
                v = v.toTensor().narrow(0, lo, n);
              }
            }
          }
          torch::jit::Stack& part = n == samples ? stack : cut;
          op.redispatchBoxed(cpu, &part);
          // Outputs in the Meta kernel's layout: the copy takes any other, but the
          // sizes must agree, as the caller already holds the outputs.
          for (size_t i = 0; i < outputs.size(); ++i) {
            const at::Tensor& r = part[i].toTensor();
            const at::Tensor into = n == samples ? host_outputs[i] : host_outputs[i].narrow(0, lo, n);
            TORCH_CHECK(r.sizes() == into.sizes() && r.scalar_type() == into.scalar_type(), "the CPU kernel gave output ",
                        i, " sizes ", r.sizes(), " and dtype ", r.scalar_type(), ", the Meta kernel ", into.sizes(),
                        " and ", into.scalar_type());
            into.copy_(r);
          }
        });
        return;
      }
      case Kind::Out:
        op.redispatchBoxed(cpu, &stack);
        check_geometry(stack, outputs);
        break;
      case Kind::InPlace:
        op.redispatchBoxed(cpu, &stack);
        check_geometry(stack, {args[0].toTensor()});
        break;
      case Kind::InPlaceList:
        op.redispatchBoxed(cpu, &stack);
        break;
      case Kind::Inline:
        TORCH_INTERNAL_ASSERT(false, "an inline call was queued");
    }
    call.copy_back_reallocated();
  }

  // The Meta kernel promised the outputs' geometries (the job's own
  // TensorImpls keep them as they were at the launch); the caller already
  // holds the tensors, so a CPU kernel that disagreed would be a bug to
  // report, not to fix up.
  static void check_geometry(const torch::jit::Stack& results, c10::ArrayRef<at::Tensor> expected) {
    for (size_t i = 0; i < expected.size(); ++i) {
      const at::Tensor& r = results[i].toTensor();
      const at::Tensor& e = expected[i];
      TORCH_CHECK(r.sizes() == e.sizes() && r.strides() == e.strides() && r.storage_offset() == e.storage_offset(),
                  "the CPU kernel gave output ", i, " a different shape or strides (", r.sizes(), ", ", r.strides(),
                  ") than the Meta kernel (", e.sizes(), ", ", e.strides(), ")");
    }
  }
};

} // namespace

namespace {

// A new signature's answer: the outputs of its first run at the call, when a
// queued call can hand out outputs like them (see outputs_ready and
// empty_device); otherwise no answer, and its calls stay at the call.
Answer answer_from_run(const Plan& plan, const torch::jit::Stack& stack, size_t nreturns) {
  if (stack.size() < nreturns) return std::nullopt;
  const bool fresh_outputs = plan.kind == Kind::Functional || plan.kind == Kind::FunctionalCopy;
  Specs specs;
  for (size_t k = stack.size() - nreturns; k < stack.size(); ++k) {
    if (!stack[k].isTensor()) return std::nullopt;
    const at::Tensor& t = stack[k].toTensor();
    if (!t.defined() || t.layout() != c10::kStrided || t.device().type() != kMyDev || t.is_conj() || t.is_neg() ||
        t.is_quantized()) {
      return std::nullopt;
    }
    if (fresh_outputs && (t.storage_offset() != 0 || !t.is_non_overlapping_and_dense())) return std::nullopt;
    specs.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  }
  return specs;
}

} // namespace

void confirm_signature(PendingConfirmation& pending, const torch::jit::Stack& stack, size_t nreturns, bool warned) {
  if (!pending.awaiting()) return;
  const Plan& plan = *std::exchange(pending.plan, nullptr);
  const std::shared_ptr<const Signature> signature = std::exchange(pending.signature, nullptr);
  // A call that warns keeps running at the call, so that its warning comes
  // where the caller can catch it, every time, as on CPU.
  if (warned) return;
  if (!signature) {
    Answer answer = answer_from_run(plan, stack, nreturns);
    const bool queueable = answer.has_value();
    auto entry = plan.meta_cache.insert(pending.new_key, std::move(answer));
    if (queueable) entry->verified.store(true, std::memory_order_release);
    return;
  }
  const Specs& specs = *signature->answer;
  // An in-place op's answer is self's geometry before the call: one that
  // restrides self (transpose_ of a square matrix) is never queued.
  bool agrees = nreturns == specs.size() && stack.size() >= nreturns;
  for (size_t k = 0; agrees && k < nreturns; ++k) {
    const c10::IValue& r = stack[stack.size() - nreturns + k];
    agrees = r.isTensor() && r.toTensor().layout() == c10::kStrided &&
             r.toTensor().sizes() == c10::IntArrayRef(specs[k].sizes) &&
             r.toTensor().scalar_type() == specs[k].dtype &&
             (r.toTensor().numel() <= 1 || r.toTensor().strides() == c10::IntArrayRef(specs[k].strides));
  }
  if (!agrees) {
    plan.refuted.store(true, std::memory_order_relaxed);
    return;
  }
  signature->verified.store(true, std::memory_order_release);
}

bool queue_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device,
                       PendingConfirmation& pending) {
  breakdown::Clock clock;
  const Plan& plan = plan_for(op);
  if (plan.kind == Kind::Inline || plan.refuted.load(std::memory_order_relaxed)) return false;
  // CPU kernels read deterministic mode, a process-wide setting, when they run:
  // queued, they would follow whatever it is by then (a caller switching it off
  // before reading the result took the nondeterministic path). While it is on,
  // host kernels run at the call, with the caller's setting.
  if (at::globalContext().deterministicAlgorithms()) return false;
  const size_t nargs = plan.args.size();
  const size_t first = stack->size() - nargs;
  const c10::IValue* args = stack->data() + first;

  DtypeScan dtypes;
  for (size_t i = 0; i < nargs; ++i) {
    dtypes.add(args[i], plan.args[i]);
    if (args[i].isDevice() && args[i].toDevice().type() == kMyDev) {
      return false;  // factories: their CPU out= kernels would not see the device
    }
  }
  if (!dtypes.queueable) return false;
  if (dtypes.integer && dtypes.floating == 0 && plan.integer_values_checked) return false;
  if (const int64_t min = queue_min_elements(); min > 0) {
    int64_t n = 0;
    for (size_t i = 0; i < nargs; ++i) n += elements(args[i]);
    if (n < min) return false;
  }
  clock.mark(breakdown::kPlan);

  thread_local CallKey key;
  key.clear();
  key.add_settings();
  bool cacheable = true;
  for (size_t i = 0; i < nargs && cacheable; ++i) {
    if (plan.kind == Kind::Out && plan.args[i].written) {
      key.add_output(args[i]);
    } else {
      cacheable = key.add(args[i], plan.exact_key);
    }
  }
  if (cacheable) add_overlaps(key, plan, args);
  clock.mark(breakdown::kKey);

  // Before anything can draw from the device's generator, the inline run included.
  const bool quiet = arguments_pass_on_empty_cpu(op, plan, args, key);

  // (A call the key cannot describe always runs at the call.)
  if (!cacheable) return false;
  std::shared_ptr<const Signature> signature = signature_for(op, plan, args, key);
  clock.mark(breakdown::kMeta);
  if (!signature) {
    // (A copy of the key: the run may call Python, whose finalisers may
    // launch mydev ops on this thread and reuse its key buffer.)
    pending.plan = &plan;
    pending.new_key = key.shape();
    return false;
  }
  if (!signature->answer) return false;
  const Specs& specs = *signature->answer;
  if (!signature->verified.load(std::memory_order_acquire)) {
    // Runs at the call, where the CPU kernel makes its checks; confirm_signature
    // checks its outputs against specs.
    pending.plan = &plan;
    pending.signature = std::move(signature);
    return false;
  }
  if (!quiet) return false;  // it warned: at the call, where the CPU kernel warns once

  // What the caller gets back.
  std::vector<at::Tensor> outputs;
  if (plan.kind == Kind::Functional || plan.kind == Kind::FunctionalCopy) {
    outputs.reserve(specs.size());
    for (const OutputSpec& spec : specs) {
      outputs.push_back(empty_device(spec.sizes, spec.strides, at::TensorOptions(spec.dtype).device(kMyDev, device)));
    }
  } else if (plan.kind == Kind::InPlace) {
    const at::Tensor& self = args[0].toTensor();
    if (!(self.sizes() == c10::IntArrayRef(specs[0].sizes) && self.strides() == c10::IntArrayRef(specs[0].strides))) {
      return false;  // an in-place op that restrides self: keep that on the calling thread
    }
    outputs.push_back(self);
  } else if (plan.kind == Kind::Out) {
    if (!outputs_ready(c10::ArrayRef<c10::IValue>(args, nargs), plan.written, specs, device)) return false;
    for (size_t i : plan.written) outputs.push_back(args[i].toTensor());
  }
  clock.mark(breakdown::kOutputs);

  // The kernel works on the inputs as they are now: a caller that restrides
  // one afterwards (resize_, t_, as_strided_; soft_margin_loss's composite
  // out= resizes its output between two queued kernels) must not change what
  // an already-launched kernel reads, as it would not on a GPU. So the job
  // has TensorImpls of its own, over leases where it can (KernelArgs.h).
  auto job = std::make_unique<QueuedCall>(QueuedCall{&plan, op, {}, {}, device, at::GradMode::is_enabled()});
  job->args.assign(std::make_move_iterator(stack->begin() + static_cast<std::ptrdiff_t>(first)),
                   std::make_move_iterator(stack->end()));
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  KernelArgs held(device);
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = job->args[i];
    // Random ops draw their CPU engine now, once nothing can send the call to
    // the inline path (which draws its own), so the stream of numbers follows
    // launch order, as with inline host kernels.
    if (plan.args[i].generator) v = host_generator(v, op.schema().arguments()[i], device);
    v = map_tensors(v, [&](const at::Tensor& t) { return held.own(t); });
  }
  if (plan.kind == Kind::Functional || plan.kind == Kind::FunctionalCopy) {
    job->outputs.reserve(outputs.size());
    for (const at::Tensor& out : outputs) job->outputs.push_back(held.own(out));
  } else if (plan.kind == Kind::Out) {
    for (size_t i : plan.written) job->outputs.push_back(job->args[i].toTensor());  // (already the job's own)
  }
  for (at::Tensor& out : outputs) stack->push_back(std::move(out));
  clock.mark(breakdown::kJob);

  // (Never a short kernel, whatever its size: mapping the arguments to the
  // host and the boxed CPU call cost more than the hand-off they would save.)
  launch_async(device, plan.label.c_str(), [job = std::move(job)] { job->run(); }, false, &held);
  clock.mark(breakdown::kLaunch);
  return true;
}

} // namespace my_device
